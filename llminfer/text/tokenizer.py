"""Tokenizers built from a GGUF file's own vocabulary, giving the same token
ids as llama.cpp for the same file and text.

    tok = Tokenizer.from_metadata(GGUFFile(path).metadata)
    ids = tok.encode("Hello", add_bos=True, special=False)
    text = tok.decode(ids)

The vocabulary kinds (tokenizer.ggml.model):
  "gpt2"   byte-level BPE: ranked merges, a pre-tokenizer regex chosen by
           tokenizer.ggml.pre; run by the `tokenizers` library.
  "llama"  SentencePiece BPE: pieces merged by score, byte fallback to
           <0xXX> tokens; run by the `sentencepiece` library from a model
           proto serialized here from the GGUF arrays (no protobuf package).
  "gemma4" BPE over UTF-8 characters (Gemma 4): spaces as U+2581, ranked
           merges within runs of newlines and runs of other characters,
           byte fallback to <0xXX> tokens; run by `tokenizers`.

Encoding follows llama.cpp (src/llama-vocab.cpp) step by step:
  1. partition: special tokens written in the text are cut out as single
     tokens, longest piece first. User-defined tokens are always cut out;
     control and unknown tokens only when special=True.
  2. each remaining text fragment goes to the BPE or SentencePiece model
     (SentencePiece: " " becomes U+2581, and with add_space_prefix a space
     is put before a fragment that starts the text or follows a token).
  3. BOS before and EOS after when the caller asks for special tokens and
     the vocabulary wants them (tokenizer.ggml.add_bos_token/add_eos_token).

Token attributes (llama.cpp's llama_token_attr bits, _A_*) start from the
GGUF token types and are then adjusted by piece text as llama.cpp does at
load: end-of-turn and fill-in-middle pieces become control tokens, and the
set of end-of-generation ids is gathered. Those attributes decide both the
partition and how a token renders when decoded.
"""

from __future__ import annotations

import codecs
import re
import warnings

import numpy as np
from llminfer.core.ggml import Keys, TokenType
from llminfer.core.gguf_file import StringArray

from llminfer.errors import TokenError, TokenizerError

SUPPORTED_MODELS = ("gpt2", "llama", "bert", "gemma4")

# llama_token_attr bits
_A_UNDEFINED = 0
_A_UNKNOWN = 1 << 0
_A_UNUSED = 1 << 1
_A_NORMAL = 1 << 2
_A_CONTROL = 1 << 3
_A_USER_DEFINED = 1 << 4
_A_BYTE = 1 << 5
_A_LSTRIP = 1 << 7
_A_RSTRIP = 1 << 8

# GGUF token type -> attribute; anything else (0, unknown values) is undefined
_TYPE_TO_ATTR = {
    TokenType.NORMAL: _A_NORMAL,
    TokenType.UNKNOWN: _A_UNKNOWN,
    TokenType.CONTROL: _A_CONTROL,
    TokenType.USER_DEFINED: _A_USER_DEFINED,
    TokenType.UNUSED: _A_UNUSED,
    TokenType.BYTE: _A_BYTE,
}

# tokens that render as nothing unless asked for (llama.cpp's attr_special)
_A_SPECIAL = _A_UNKNOWN | _A_CONTROL

# the bytes C's isspace() accepts; llama.cpp strips these around LSTRIP/RSTRIP tokens
_C_SPACE = " \t\n\v\f\r"

SPACE_MARK = "\u2581"  # SentencePiece's escaped space
_BYTE_PIECE = re.compile(r"<0x([0-9A-Fa-f]{2})>")

# ---------------------------------------------------------------------------
# special pieces recognised by text (llama.cpp, llama_vocab::impl::load)
# ---------------------------------------------------------------------------

_EOT_PIECES = (
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
    "<|end_of_text|>", "<EOT>", "_<EOT>", "[EOT]", "<\uff5cend\u2581of\u2581sentence\uff5c>",
    "<end_of_utterance>",
)
_EOM_PIECES = ("<|eom_id|>",)
# fill-in-middle roles: metadata key, pieces that stand for it when the key is absent
_FIM_PIECES = {
    "pre": (Keys.Tokenizer.FIM_PRE_ID, ("<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>",
            "<\uff5cfim\u2581begin\uff5c>", "<PRE>", "\u2581<PRE>", "<|code_prefix|>", "<|prefix|>")),
    "suf": (Keys.Tokenizer.FIM_SUF_ID, ("<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>",
            "<\uff5cfim\u2581hole\uff5c>", "<SUF>", "\u2581<SUF>", "<|code_suffix|>", "<|suffix|>")),
    "mid": (Keys.Tokenizer.FIM_MID_ID, ("<|fim_middle|>", "<fim-middle>", "<fim_middle>",
            "<\uff5cfim\u2581end\uff5c>", "<MID>", "\u2581<MID>", "<|code_middle|>", "<|middle|>")),
    "pad": (Keys.Tokenizer.FIM_PAD_ID, ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]")),
    "rep": (Keys.Tokenizer.FIM_REP_ID, ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>")),
    "sep": (Keys.Tokenizer.FIM_SEP_ID, ("<|file_sep|>",)),
}
# older key names for the first three roles
_FIM_OLD_KEYS = {"pre": Keys.Tokenizer.PREFIX_ID, "suf": Keys.Tokenizer.SUFFIX_ID, "mid": Keys.Tokenizer.MIDDLE_ID}

# pieces that end generation wherever they appear in a vocabulary
_EOG_PIECES = frozenset((
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
    "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
    "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
    "<\uff5cend\u2581of\u2581sentence\uff5c>", "[e~[",
))
# gpt-oss markup that llama.cpp always renders, as user-defined tokens
_ALWAYS_RENDERED = ("<|channel|>", "<|message|>", "<|start|>", "<|constrain|>")

# ---------------------------------------------------------------------------
# pre-tokenizer regexes by tokenizer.ggml.pre (llama.cpp, llm_tokenizer_bpe).
# Each list is applied in turn, each regex splitting the pieces of the one
# before; text between matches stays a piece of its own.
# ---------------------------------------------------------------------------

_RE_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_RE_CONTRACTIONS = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
_RE_LLAMA3 = (_RE_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
              r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_RE_QWEN2 = (_RE_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
             r"|\s*[\r\n]+|\s+(?!\S)|\s+")
# Qwen 3.5: combining marks stay with their letters
_RE_QWEN35 = (_RE_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"
              r"|\s*[\r\n]+|\s+(?!\S)|\s+")
# Case-split words (tekken, gpt-4o). The tokenizer.json form names the Unicode
# case classes; llama.cpp runs "a letter that is not a-z" / "not A-Z" instead,
# so every letter outside ASCII counts as both cases: that form is used here,
# since llama.cpp is what GGUF files are checked against.
_UPPERISH = r"((?=[\p{L}])([^a-z]))"
_LOWERISH = r"((?=[\p{L}])([^A-Z]))"
# what follows the words in the case-splitting families: punctuation runs
# (with the newlines and slashes after them), newlines, spaces
_CASE_TAIL = r"| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
_RE_TEKKEN = (rf"[^\r\n\p{{L}}\p{{N}}]?{_UPPERISH}*{_LOWERISH}+|[^\r\n\p{{L}}\p{{N}}]?{_UPPERISH}+{_LOWERISH}*"
              r"|\p{N}" + _CASE_TAIL)
_RE_GPT4O = (rf"[^\r\n\p{{L}}\p{{N}}]?{_UPPERISH}*{_LOWERISH}+{_RE_CONTRACTIONS}?"
             rf"|[^\r\n\p{{L}}\p{{N}}]?{_UPPERISH}+{_LOWERISH}*{_RE_CONTRACTIONS}?"
             r"|\p{N}{1,3}" + _CASE_TAIL)
_RE_GRANITE_MULTI = _RE_GPT4O.replace(r"(?=[\p{L}])", r"(?=[\p{L}\p{M}])")
# tiny_aya and youtu name the case classes; llama.cpp reads each of \p{Lu},
# \p{Ll}, \p{Lt}, \p{Lm}, \p{Lo} as any letter, so there a word does not
# split where its case changes: the two case alternatives ([Lu..]*[Ll..]+ and
# [Lu..]+[Ll..]*) both become runs of letters and marks, written here once.
_ANY_CASE_WORD = r"[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+" + _RE_CONTRACTIONS + "?"
_RE_TINY_AYA = _ANY_CASE_WORD + r"|\p{N}{1,3}" + _CASE_TAIL
_RE_YOUTU = _ANY_CASE_WORD + r"|\p{N}" + _CASE_TAIL
# llama.cpp turns every non-ASCII space into a vertical tab before matching:
# such a space matches \s but never a class written out by code points, which
# a regex here says with this lookahead (unicode_set_whitespace's members)
_NOT_WIDE_SPACE = "(?![\u0085\u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000])"
# DeepSeek: CJK runs and digit runs split before the word regex
_CJK_DS = "(?:" + _NOT_WIDE_SPACE + "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff])+"
_RE_DS_LETTERS = (
    "\\s?[A-Za-z\u00b5\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u01ba\u01bc-\u01bf\u01c4-\u0293\u0295-\u02af"
    "\u0370-\u0373\u0376\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a\u038c\u038e-\u03a1\u03a3-\u03f5"
    "\u03f7-\u0481\u048a-\u052f\u0531-\u0556\u10a0-\u10c5\u13a0-\u13f5\u13f8-\u13fd\u1c90-\u1cba"
    "\u1cbd-\u1cbf\u1d00-\u1d2b\u1d6b-\u1d77\u1d79-\u1d9a\u1e00-\u1f15\u1f18-\u1f1d\u1f20-\u1f45"
    "\u1f48-\u1f4d\u1f50-\u1f57\u1f59\u1f5b\u1f5d\u1f5f-\u1f7d\u1f80-\u1fb4\u1fb6-\u1fbc\u1fbe"
    "\u1fc2-\u1fc4\u1fc6-\u1fcc\u1fd0-\u1fd3\u1fd6-\u1fdb\u1fe0-\u1fec\u1ff2-\u1ff4\u1ff6-\u1ffc"
    "\u2102\u2107\u210a-\u2113\u2115\u2119-\u211d\u2124\u2126\u2128\u212a-\u212d\u212f-\u2134\u2139"
    "\u213c-\u213f\u2145-\u2149\u214e\u2183\u2184\u2c00-\u2c7b\u2c7e-\u2ce4\u2ceb-\u2cee\u2cf2\u2cf3"
    "\ua640-\ua66d\ua680-\ua69b\ua722-\ua76f\ua771-\ua787\ua78b-\ua78e\uab70-\uabbf\ufb00-\ufb06"
    "\ufb13-\ufb17\uff21-\uff3a\uff41-\uff5a\U00010400-\U0001044f\U000104b0-\U000104d3"
    "\U000104d8-\U000104fb\U00010c80-\U00010cb2\U00010cc0-\U00010cf2\U000118a0-\U000118df"
    "\U0001e900-\U0001e943]+")
_RE_DS3 = (r"[!" + '"' + r"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+"
           r"| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_RE_BLOOM = " ?[^(\\s|.,!?\u2026\u3002\uff0c\u3001\u0964\u06d4\u060c)]+"


class _Pre:
    """One pre-tokenizer family: its regexes and the flags that go with it."""

    def __init__(self, regexes, ignore_merges=False, add_bos=False, no_bos=False):
        self.regexes = regexes
        self.ignore_merges = ignore_merges  # a word that is itself a token skips the merges
        self.add_bos = add_bos              # default for add_bos_token when the key is absent
        self.no_bos = no_bos                # the family has no BOS unless the metadata names one


_PRE_DEFAULT = _Pre([r"[\p{P}\$\+<=>\^~\|]+", _RE_GPT2, r"\p{N}+", r"[0-9][0-9][0-9]"])
_PRE_LLAMA3 = _Pre([_RE_LLAMA3], ignore_merges=True, add_bos=True)
_PRE_GPT2 = _Pre([_RE_GPT2])
_PRE_STARCODER = _Pre([r"\p{N}", _RE_GPT2])  # digits one by one, then GPT-2
_PRE_QWEN2 = _Pre([_RE_QWEN2])
_PRE_FALCON = _Pre([r"[\p{P}\$\+<=>\^~\|`]+", _RE_GPT2, r"[0-9][0-9][0-9]"])
_PRE_DS3 = _Pre([r"\p{N}{1,3}", "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+", _RE_DS3])

_PRE_BY_NAME = {"default": _PRE_DEFAULT, "falcon": _PRE_FALCON}
for _names, _pre in (
    (("llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2", "jina-v5-nano"),
     _PRE_LLAMA3),
    (("dbrx", "smaug-bpe"), _Pre([_RE_LLAMA3])),
    (("chatglm-bpe",), _Pre([_RE_LLAMA3], no_bos=True)),
    (("glm4", "glm5"), _Pre([_RE_LLAMA3], ignore_merges=True, no_bos=True)),
    (("gpt2", "gpt-2", "phi-2", "jina-es", "jina-de", "gigachat", "jina-v2-es", "jina-v2-de", "a.x-4.0",
      "mellum", "modern-bert", "mpt", "olmo", "jais", "trillion", "granite-docling", "exaone4",
      "jina-v1-en", "jina-v2-code", "roberta-bpe"), _PRE_GPT2),
    (("starcoder", "refact", "command-r", "smollm", "codeshell", "exaone", "minerva-7b", "mellum2"),
     _PRE_STARCODER),
    (("qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "megrez", "stablelm2", "hunyuan", "solar-open", "grok-2"),
     _PRE_QWEN2),
    (("qwen35",), _Pre([_RE_QWEN35])),
    (("gpt-4o", "llama4", "kanana2", "talkie", "minimax-m2"), _Pre([_RE_GPT4O])),
    (("granite-embed-multi-97m",), _Pre([_RE_GRANITE_MULTI], ignore_merges=True)),
    (("tiny_aya", "cohere2moe"), _Pre([r"[0-9]{1,3}(?=(?:[0-9]{3})*\b)", _RE_TINY_AYA])),  # \d: ASCII there
    (("tekken",), _Pre([_RE_TEKKEN], ignore_merges=True, add_bos=True)),
    (("youtu",), _Pre(["[\uac00-\ud7a3\u3131-\u318e]+|[\uff01\u2026\u201c\u201d\u2018\u2019\u2014\uff1a\uff1b"
                       "\uff0c\u3001-\u303f\ufe30-\ufe4f]+|[\u3105-\u312f]+|[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",
                       _RE_YOUTU], ignore_merges=True)),
    (("deepseek-llm",), _Pre([r"[\r\n]", _RE_DS_LETTERS,
                              "\\s?(?:" + _NOT_WIDE_SPACE + "[!-/:-~\uff01-\uff0f\uff1a-\uff5e\u2018-\u201f\u3000-\u3002])+",
                              r"\s+\z",  # the end of the piece ($ in Oniguruma is also before a newline)
                              _CJK_DS, r"\p{N}+"])),
    (("deepseek-coder",), _Pre([r"[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", _CJK_DS, r"\p{N}"])),
    (("deepseek-v3", "hunyuan-dense", "joyai-llm", "hy_v4"), _PRE_DS3),
    (("spark2_5",), _Pre([r"\p{N}{1,3}", "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",
                          _RE_DS3.replace(r"[\r\n]*|\s*[\r\n]+|", r"|[\r\n]|"), r"\p{N}"])),
    (("poro-chat", "bloom", "gpt3-finnish"), _Pre([_RE_BLOOM])),
    (("viking",), _Pre([_RE_BLOOM, r"\p{N}"])),
    (("chameleon",), _Pre([r"<sentinel:[0-9]+>", r"(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z", r"([\t\n]|    |  )",
                           r"\p{N}", r"[\p{P}!-/:-@\[-`{-~]", _RE_GPT2], add_bos=True)),
    (("bailingmoe", "bailingmoe2", "llada-moe"),
     _Pre([r"'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
           r"|\s*[\r\n]|\s+(?!\S)|\s+"])),
    (("seed-coder",), _Pre([_RE_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+"
                            r"|\s*[\r\n]+|\s+(?!\S)|\s+"])),
    (("ufakzeka",), _Pre([r"[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"])),
    (("laguna",), _Pre([r"[^\n]+|[\n]+", _RE_QWEN2])),
    (("minicpm5",), _Pre([r"\p{N}{1,3}", _RE_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}+"
                          r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"], ignore_merges=True)),
    (("exaone-moe",), _Pre([_RE_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?(?:\p{L}\p{M}*(?: \p{L}\p{M}*)*)+|\p{N}"
                            r"| ?[^\s\p{L}\p{N}]+[\r\n/]?|\s*[\r\n]|\s+(?!\S)|\s+"])),
    (("jais-2",), _Pre([_RE_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                        r"|\s*[\r\n]+" + "".join(rf"|\s{{{n}}}(?!\S)" for n in (512, 256, 128, 64, 32, 16, 8, 4))
                        + r"|\s{1,2}(?!\S)|\s{1}"])),
):
    for _name in _names:
        _PRE_BY_NAME[_name] = _pre
del _names, _pre, _name

# Pre-tokenizers llama.cpp implements with code of its own (digit grouping,
# Han exclusion) or without GPT-2 byte encoding: refused by name rather than
# split with the wrong regexes.
_PRE_NOT_IMPLEMENTED = frozenset((
    "kimi-k2", "afmoe", "superbpe", "gemma4", "granite-embed-multi-311m", "sarvam-moe", "whitespace",
))


def _byte_level_alphabet():
    """GPT-2's byte -> printable character table: printable Latin-1 bytes
    stand for themselves, the other 68 take code points from 256 up."""
    keep = list(range(0x21, 0x7F)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    table = {b: chr(b) for b in keep}
    extra = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return table


_CHAR_TO_BYTE = {c: b for b, c in _byte_level_alphabet().items()}


# ---------------------------------------------------------------------------
# vocabulary: pieces, attributes, special ids (backend-independent)
# ---------------------------------------------------------------------------


def _meta_id(metadata, key, n_vocab):
    """A token id from metadata, or None when absent or out of range."""
    value = metadata.get(key)
    if value is None or isinstance(value, (str, bytes, list, np.ndarray)):
        return None
    value = int(value)
    return value if 0 <= value < n_vocab else None


def _default_id(value, n_vocab):
    return value if value is not None and 0 <= value < n_vocab else None


class _PieceIndex:
    """piece -> id over a StringArray, as a dict would answer (in, get, [],
    len) without holding every piece again as a str: for Gemma 3's 262k
    pieces a dict took 32 MiB, this 4 (a sorted array of the pieces' 64-bit
    hashes and their ids; a lookup checks the piece's bytes). Raises
    TokenizerError when two ids hold the same piece."""

    __slots__ = ("_pieces", "_hashes", "_ids")

    def __init__(self, pieces: StringArray):
        h = pieces.hashes()
        order = np.argsort(h, kind="stable")
        self._pieces = pieces
        self._hashes = h[order]
        self._ids = order
        # runs of equal hashes: duplicates, or (rarely) pieces that collide
        same = np.nonzero(self._hashes[1:] == self._hashes[:-1])[0].tolist()
        k = 0
        while k < len(same):
            start = same[k]
            while k + 1 < len(same) and same[k + 1] == same[k] + 1:
                k += 1
            seen = {}
            for tid in sorted(order[start:same[k] + 2].tolist()):
                raw = pieces.raw(tid)
                if raw in seen:
                    raise TokenizerError(
                        f"duplicate piece {pieces[tid]!r} in the vocabulary: ids {seen[raw]} and {tid}")
                seen[raw] = tid
            k += 1

    def __len__(self):
        return len(self._ids)

    def get(self, piece, default=None):
        if not isinstance(piece, str):
            return default
        try:
            raw = piece.encode("utf-8")
        except UnicodeEncodeError:  # lone surrogates: no piece holds them
            return default
        from llminfer import _core

        h = np.uint64(_core.hash_bytes(raw))
        i = int(np.searchsorted(self._hashes, h))
        while i < len(self._hashes) and self._hashes[i] == h:
            tid = int(self._ids[i])
            if self._pieces.raw(tid) == raw:
                return tid
            i += 1
        return default

    def __contains__(self, piece):
        return self.get(piece) is not None

    def __getitem__(self, piece):
        tid = self.get(piece)
        if tid is None:
            raise KeyError(piece)
        return tid

    def to_dict(self) -> dict:
        """A dict of every piece (for backends that take one)."""
        return dict(zip(self._pieces, range(len(self._ids))))


class _Vocab:
    """Pieces, per-token attributes and special ids, as llama.cpp loads them."""

    def __init__(self, metadata: dict, kind: str, pre: _Pre | None):
        pieces = _pieces(metadata)
        n = len(pieces)
        if not isinstance(pieces, StringArray):
            if not all(isinstance(p, str) for p in pieces):
                raise TokenizerError(f"{Keys.Tokenizer.LIST} holds an item that is not a string")
            pieces = StringArray.of(pieces)
        if (pieces.lengths() == 0).any():  # llama.cpp names empty pieces so they stay distinct
            pieces = StringArray.of(p or f"[EMPTY_{i}]" for i, p in enumerate(pieces))
        self.pieces = pieces
        self.n_vocab = n
        self.ids = _PieceIndex(pieces)

        self.scores = _array(metadata, Keys.Tokenizer.SCORES, n, np.float32, 0.0)
        types = _array(metadata, Keys.Tokenizer.TOKEN_TYPE, n, np.int32, int(TokenType.NORMAL))
        lut = np.zeros(8, dtype=np.int32)
        for t, a in _TYPE_TO_ATTR.items():
            lut[int(t)] = a
        attrs = np.where((types >= 0) & (types < 8), lut[np.clip(types, 0, 7)], _A_UNDEFINED)
        self.attrs = attrs.astype(np.int32)

        # defaults per vocabulary kind, then the metadata keys. Only the
        # SentencePiece path puts a space before the text, so only there is it
        # taken off again when decoding (llama.cpp's BPE encoder ignores the key).
        if kind == "llama":
            bos, eos, unk = 1, 2, 0
            self.add_bos = True
            self.add_space_prefix = bool(metadata.get(Keys.Tokenizer.ADD_PREFIX, True))
        elif kind == "gemma4":  # llama.cpp: no default special ids, BOS always added
            bos, eos, unk = None, None, None
            self.add_bos = True
            self.add_space_prefix = False
        elif kind == "bert":
            # WordPiece: [CLS] text [SEP]; llama.cpp's add_sep is our add_eos with [SEP] as EOS
            sep = metadata.get("tokenizer.ggml.seperator_token_id", 102)
            bos, eos, unk = 101, sep, 100
            self.add_bos = True
            self.add_space_prefix = False
        else:
            bos, eos, unk = (None if pre.no_bos else 11), 11, None
            self.add_bos = pre.add_bos
            self.add_space_prefix = False
        self.add_eos = kind == "bert"
        self.bos_id = _meta_id(metadata, Keys.Tokenizer.BOS_ID, n)
        if self.bos_id is None:
            self.bos_id = _default_id(bos, n)
        self.eos_id = _meta_id(metadata, Keys.Tokenizer.EOS_ID, n)
        if self.eos_id is None:
            self.eos_id = _default_id(eos, n)
        self.unk_id = _meta_id(metadata, Keys.Tokenizer.UNK_ID, n)
        if self.unk_id is None:
            self.unk_id = _default_id(unk, n)
        self.eot_id = _meta_id(metadata, Keys.Tokenizer.EOT_ID, n)
        self.eom_id = _meta_id(metadata, Keys.Tokenizer.EOM_ID, n)
        if Keys.Tokenizer.ADD_BOS in metadata and kind != "gemma4":  # llama.cpp overrides it to true for Gemma 4
            self.add_bos = bool(metadata[Keys.Tokenizer.ADD_BOS])
        if Keys.Tokenizer.ADD_EOS in metadata:
            self.add_eos = bool(metadata[Keys.Tokenizer.ADD_EOS])
        if kind == "bert":  # [SEP] closes the text unless add_sep_token says otherwise
            self.add_eos = bool(metadata.get("tokenizer.ggml.add_sep_token", True))
        if self.add_bos and self.bos_id is None:
            raise TokenizerError(f"{Keys.Tokenizer.ADD_BOS} is true, but the vocabulary has no BOS token")
        if self.add_eos and self.eos_id is None:
            raise TokenizerError(f"{Keys.Tokenizer.ADD_EOS} is true, but the vocabulary has no EOS token")

        self._detect_by_text(metadata)
        self._per_model_strip(metadata)
        self._build_special_index()

    def _mark_control(self, tid):
        self.attrs[tid] |= _A_CONTROL

    def _first_present(self, candidates):
        """The lowest id among pieces in candidates (llama.cpp takes whichever
        its hash map yields first; vocabularies hold at most one of each)."""
        found = [self.ids[p] for p in candidates if p in self.ids]
        return min(found) if found else None

    def _detect_by_text(self, metadata):
        ids = self.ids
        if self.eot_id is None:
            self.eot_id = self._first_present(_EOT_PIECES)
            if self.eot_id is not None:
                self._mark_control(self.eot_id)
        if self.eom_id is None:
            self.eom_id = self._first_present(_EOM_PIECES)
            if self.eom_id is not None:
                self._mark_control(self.eom_id)
        fim = {}
        for role, (key, candidates) in _FIM_PIECES.items():
            tid = _meta_id(metadata, key, self.n_vocab)
            if tid is None and role in _FIM_OLD_KEYS:
                tid = _meta_id(metadata, _FIM_OLD_KEYS[role], self.n_vocab)
            if tid is None:
                tid = self._first_present(candidates)
                if tid is not None:
                    self._mark_control(tid)
            fim[role] = tid

        eog = {fim[r] for r in ("pad", "rep", "sep") if fim[r] is not None}
        for piece in _EOG_PIECES:
            tid = ids.get(piece)
            if tid is not None:
                eog.add(tid)
                self._mark_control(tid)
        for piece in _ALWAYS_RENDERED:
            tid = ids.get(piece)
            if tid is not None:
                self.attrs[tid] = _A_USER_DEFINED
        eog.update(t for t in (self.eos_id, self.eot_id, self.eom_id) if t is not None)

        texts = {self.pieces[t] for t in eog}
        # harmony-style vocabularies: <|end|> closes a message, not the generation
        has_call = bool(texts & {"<|call|>", "<|calls|>"})
        if "<|end|>" in texts and has_call and ("<|return|>" in texts or "<|flush|>" in texts):
            end = ids["<|end|>"]
            eog.discard(end)
            self.attrs[end] = _A_USER_DEFINED
        # Gemma 4 style: </s> is markup there when <|tool_response> exists
        if "<|tool_response>" in texts and "</s>" in texts:
            s = ids["</s>"]
            eog.discard(s)
            self.attrs[s] = _A_NORMAL
        self.eog_ids = frozenset(int(t) for t in eog)

    def _per_model_strip(self, metadata):
        """Whitespace stripping around a few special tokens, chosen by model
        name as llama.cpp does (the GGUF has no per-token flags for it)."""
        name = str(metadata.get("general.name", "")).lower()
        pre = str(metadata.get(Keys.Tokenizer.PRE, ""))
        arch = str(metadata.get("general.architecture", ""))
        ids = self.ids
        if any(s in pre for s in ("jina-v2-de", "jina-v2-es", "jina-v2-code")) or any(
                s in arch for s in ("nomic-bert-moe", "jina-bert-v3")):
            if "<mask>" in ids:
                self.attrs[ids["<mask>"]] |= _A_LSTRIP
        elif "phi-3" in name or "phi3" in name:
            special = np.nonzero(self.attrs & (_A_CONTROL | _A_USER_DEFINED | _A_UNKNOWN))[0]
            self.attrs[special] |= _A_RSTRIP
            for piece, on in (("</s>", True), ("<unk>", False), ("<s>", False), ("<|endoftext|>", False)):
                if piece in ids:
                    if on:
                        self.attrs[ids[piece]] |= _A_RSTRIP
                    else:
                        self.attrs[ids[piece]] &= ~_A_RSTRIP
        elif "modern-bert" in name and "[MASK]" in ids:
            self.attrs[ids["[MASK]"]] |= _A_LSTRIP

    def _build_special_index(self):
        """Special tokens in the order llama.cpp tries them (longest UTF-8
        piece first), indexed by their first two characters so that encode
        only looks for the ones whose start occurs in the text."""
        special = np.nonzero(self.attrs & (_A_CONTROL | _A_USER_DEFINED | _A_UNKNOWN))[0].tolist()
        special.sort(key=lambda t: (-len(self.pieces[t].encode("utf-8")), t))
        self.special_order = {t: k for k, t in enumerate(special)}
        self.special_by_prefix = {}
        for t in special:
            p = self.pieces[t]
            self.special_by_prefix.setdefault(p[:2], []).append(t)

    def specials_in(self, text, parse_special):
        """(id, piece, attr) of the special tokens that occur in text, longest first."""
        found = []
        for prefix, group in self.special_by_prefix.items():
            if prefix not in text:
                continue
            for t in group:
                attr = int(self.attrs[t])
                if not parse_special and attr & _A_SPECIAL:
                    continue
                p = self.pieces[t]
                if p in text:
                    found.append(t)
        found.sort(key=self.special_order.__getitem__)
        return [(t, self.pieces[t], int(self.attrs[t])) for t in found]


def _pieces(metadata):
    """The vocabulary's pieces (a StringArray, or a list of str), or TokenizerError."""
    pieces = metadata.get(Keys.Tokenizer.LIST)
    if not isinstance(pieces, (list, StringArray)) or not pieces or not isinstance(pieces[0], str):
        raise TokenizerError(f"metadata has no vocabulary ({Keys.Tokenizer.LIST} missing or empty)")
    return pieces


def _array(metadata, key, n, dtype, fill):
    value = metadata.get(key)
    if value is None:
        return np.full(n, fill, dtype=dtype)
    arr = np.asarray(value, dtype=dtype)
    if arr.ndim != 1 or len(arr) < n:
        raise TokenizerError(f"{key} has {arr.size} entries for {n} tokens")
    return arr[:n]


def _partition(vocab: _Vocab, text: str, parse_special: bool):
    """Cut special tokens out of text: a list of str (raw text) and int
    (token id) fragments. Each special token, longest first, splits every
    raw fragment at all its occurrences (llama.cpp, tokenizer_st_partition)."""
    fragments = [text]
    for tid, piece, attr in vocab.specials_in(text, parse_special):
        out = []
        for frag in fragments:
            if isinstance(frag, int) or piece not in frag:
                out.append(frag)
                continue
            start = 0
            while True:
                at = frag.find(piece, start)
                if at < 0:
                    break
                left = frag[start:at]
                if attr & _A_LSTRIP:
                    left = left.rstrip(_C_SPACE)
                if left:
                    out.append(left)
                out.append(tid)
                start = at + len(piece)
                if attr & _A_RSTRIP:
                    while start < len(frag) and frag[start] in _C_SPACE:
                        start += 1
            if start < len(frag):
                out.append(frag[start:])
        fragments = out
    return fragments


# ---------------------------------------------------------------------------
# backends
# ---------------------------------------------------------------------------


class _BPEModel:
    """Byte-level BPE through `tokenizers`: the pre-tokenizer regexes split
    each fragment into words, words become GPT-2 byte characters, and ranked
    merges run inside each word."""

    def __init__(self, vocab: _Vocab, metadata: dict, pre: _Pre):
        from tokenizers import Regex, models, pre_tokenizers
        from tokenizers import Tokenizer as HFTokenizer

        ids = vocab.ids.to_dict()  # `tokenizers` takes a dict; it keeps its own copy
        merges = _bpe_merges(vocab, metadata)
        try:
            # No word cache: `tokenizers` (0.23) never frees the words a BPE
            # model cached when the model is dropped, about 0.5 KiB per load
            # here (bench/soak.py); without it a long text encodes ~10% slower.
            model = models.BPE(vocab=ids, merges=merges, ignore_merges=pre.ignore_merges,
                               fuse_unk=False, byte_fallback=False, cache_capacity=0)
        except Exception as e:  # tokenizers raises plain Exception subclasses
            raise TokenizerError(f"cannot build the BPE model: {e}") from e
        hf = HFTokenizer(model)
        steps = [pre_tokenizers.Split(Regex(r), behavior="isolated", invert=False) for r in pre.regexes]
        steps.append(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False))
        hf.pre_tokenizer = pre_tokenizers.Sequence(steps)
        self._hf = hf

    def encode(self, fragments, add_space_prefix):
        texts = [f for f in fragments if isinstance(f, str)]
        if len(texts) == 1:
            encoded = iter([self._hf.encode(texts[0], add_special_tokens=False)])
        else:
            encoded = iter(self._hf.encode_batch(texts, add_special_tokens=False))
        out = []
        for f in fragments:
            if isinstance(f, int):
                out.append(f)
            else:
                out.extend(next(encoded).ids)
        return out


def _bpe_merges(vocab: _Vocab, metadata: dict) -> list:
    """The merges (a, b) of tokenizer.ggml.merges whose parts and result
    are pieces: `tokenizers` refuses the others (llama.cpp would apply one
    and then spell the result byte by byte); vocabularies converted from
    tokenizer.json have none."""
    merges_raw = metadata.get(Keys.Tokenizer.MERGES)
    if not isinstance(merges_raw, (list, StringArray)):
        raise TokenizerError(f"a BPE vocabulary needs {Keys.Tokenizer.MERGES}; the metadata has none")
    ids = vocab.ids
    merges = []
    for m in merges_raw:
        cut = m.find(" ", 1)  # the first piece may itself be a space
        if cut < 0:
            continue
        a, b = m[:cut], m[cut + 1:]
        if a in ids and b in ids and a + b in ids:
            merges.append((a, b))
    return merges


class _Gemma4Model:
    """Gemma 4's BPE (tokenizer.ggml.model "gemma4", llama.cpp's
    LLAMA_VOCAB_PRE_TYPE_GEMMA4): a fragment's spaces become U+2581, it is
    cut into runs of newlines and runs of anything else, and ranked merges
    run within each run over its UTF-8 characters (no GPT-2 byte mapping).
    A run of newlines that is a piece is that token. What ends in no piece
    becomes <0xXX> byte tokens (`tokenizers`' byte fallback)."""

    _RUNS = re.compile(r"[^\n]+|\n+")

    def __init__(self, vocab: _Vocab, metadata: dict):
        from tokenizers import Tokenizer as HFTokenizer
        from tokenizers import models

        self._ids = vocab.ids
        try:
            model = models.BPE(vocab=vocab.ids.to_dict(), merges=_bpe_merges(vocab, metadata), fuse_unk=False,
                               byte_fallback=True, cache_capacity=0)
        except Exception as e:  # tokenizers raises plain Exception subclasses
            raise TokenizerError(f"cannot build the BPE model: {e}") from e
        self._hf = HFTokenizer(model)  # no pre-tokenizer: encode is handed one run at a time

    def encode(self, fragments, add_space_prefix):
        out, runs, slots = [], [], []
        for f in fragments:
            if isinstance(f, int):
                out.append(f)
                continue
            for m in self._RUNS.finditer(f.replace(" ", SPACE_MARK)):
                run = m.group(0)
                tid = self._ids.get(run) if run[0] == "\n" else None
                if tid is not None:
                    out.append(tid)
                else:
                    slots.append(len(out))
                    out.append(None)
                    runs.append(run)
        if runs:
            for at, enc in zip(slots, self._hf.encode_batch(runs, add_special_tokens=False)):
                out[at] = enc.ids
        flat = []
        for x in out:
            if isinstance(x, list):
                flat.extend(x)
            else:
                flat.append(x)
        return flat


def _varint_sizes(values):
    """Bytes each non-negative value takes as a protobuf varint."""
    sizes = np.ones(len(values), dtype=np.int64)
    for bits in (7, 14, 21, 28, 35):
        sizes += values >= (1 << bits)
    return sizes


def _put_varints(buf, at, values, sizes):
    """Write varints into buf (uint8) at positions at (vectorised)."""
    values = values.astype(np.int64)
    for k in range(int(sizes.max()) if len(sizes) else 0):
        rows = sizes > k
        byte = (values[rows] >> (7 * k)) & 0x7F
        byte |= np.where(sizes[rows] > k + 1, 0x80, 0)
        buf[at[rows] + k] = byte


def _varint(value):
    value &= (1 << 64) - 1  # negative int32 fields travel as 10-byte two's complement
    out = bytearray()
    while True:
        b = value & 0x7F
        value >>= 7
        if value:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _field(number, wire, payload):
    """One protobuf field: wire 0 = varint (payload int), 2 = bytes."""
    key = _varint((number << 3) | wire)
    if wire == 0:
        return key + _varint(payload)
    return key + _varint(len(payload)) + payload


# sentencepiece_model.proto: ModelProto.pieces = 1, trainer_spec = 2, normalizer_spec = 3;
# SentencePiece.piece = 1 (string), score = 2 (float), type = 3 (enum);
# TrainerSpec.model_type = 3 (BPE = 2), vocab_size = 4, byte_fallback = 35,
# unk_id = 40, bos_id = 41, eos_id = 42, pad_id = 43;
# NormalizerSpec.name = 1, add_dummy_prefix = 3, remove_extra_whitespaces = 4,
# escape_whitespaces = 5.
_SP_NORMAL, _SP_UNKNOWN, _SP_BYTE = 1, 2, 6
_SP_MODEL_BPE = 2


def _sentencepiece_proto(pieces, scores, sp_types, unk_id, byte_fallback):
    """Serialize a SentencePiece ModelProto. The pieces are the bulk (262k for
    Gemma), so their records are laid out with numpy rather than one by one,
    a slice of the vocabulary at a time to keep the temporaries small:

        0x0A len(B) | B = 0x0A len(piece) piece  0x15 score(f32)  0x18 type
    """
    step = 1 << 15
    records = b"".join(_piece_records(pieces[i:i + step], scores[i:i + step], sp_types[i:i + step])
                       for i in range(0, len(pieces), step))
    n = len(pieces)
    trainer = b"".join((
        _field(3, 0, _SP_MODEL_BPE), _field(4, 0, n), _field(35, 0, int(byte_fallback)),
        _field(40, 0, unk_id), _field(41, 0, -1), _field(42, 0, -1), _field(43, 0, -1),
    ))
    normalizer = b"".join((
        _field(1, 2, b"identity"), _field(3, 0, 0), _field(4, 0, 0), _field(5, 0, 0),
    ))
    return records + _field(2, 2, trainer) + _field(3, 2, normalizer)


def _piece_records(pieces, scores, sp_types):
    """The serialized piece records of a slice of the vocabulary."""
    raw = [p.encode("utf-8") for p in pieces]
    n = len(raw)
    lens = np.fromiter(map(len, raw), dtype=np.int64, count=n)
    len_sz = _varint_sizes(lens)
    body = 1 + len_sz + lens + 5 + 2
    body_sz = _varint_sizes(body)
    rec = 1 + body_sz + body
    start = np.zeros(n, dtype=np.int64)
    np.cumsum(rec[:-1], out=start[1:])
    buf = np.zeros(int(rec.sum()), dtype=np.uint8)

    buf[start] = 0x0A
    _put_varints(buf, start + 1, body, body_sz)
    p_key = start + 1 + body_sz
    buf[p_key] = 0x0A
    _put_varints(buf, p_key + 1, lens, len_sz)
    text_at = p_key + 1 + len_sz
    flat = np.frombuffer(b"".join(raw), dtype=np.uint8)
    # destination of every piece byte: its piece's text start plus its offset inside the piece
    first = np.zeros(n, dtype=np.int64)
    np.cumsum(lens[:-1], out=first[1:])
    buf[np.repeat(text_at - first, lens) + np.arange(len(flat))] = flat
    s_key = text_at + lens
    buf[s_key] = 0x15
    f32 = np.ascontiguousarray(scores, dtype="<f4").view(np.uint8).reshape(n, 4)
    buf[(s_key + 1)[:, None] + np.arange(4)] = f32
    buf[s_key + 5] = 0x18
    buf[s_key + 6] = sp_types
    return buf.tobytes()


class _SPMModel:
    """SentencePiece BPE: a fragment is split into characters and the pair
    whose merged piece scores highest is merged first; characters that end
    up in no piece fall back to <0xXX> byte tokens.

    llama.cpp looks merged text up among all pieces, so every piece is
    NORMAL in the proto except the unknown piece and the byte pieces that
    sentencepiece needs typed. Special tokens never reach it: the partition
    cuts them out. Spaces are escaped here, so its normalizer is identity."""

    def __init__(self, vocab: _Vocab):
        import sentencepiece

        sp_types = np.full(vocab.n_vocab, _SP_NORMAL, dtype=np.uint8)
        byte_ids = np.nonzero(vocab.attrs & _A_BYTE)[0]
        n_bytes = 0
        for t in byte_ids.tolist():
            if _BYTE_PIECE.fullmatch(vocab.pieces[t]):
                sp_types[t] = _SP_BYTE
                n_bytes += 1
        unk = vocab.unk_id if vocab.unk_id is not None else 0
        sp_types[unk] = _SP_UNKNOWN
        blob = _sentencepiece_proto(vocab.pieces, vocab.scores, sp_types, unk, n_bytes > 0)
        try:
            self._sp = sentencepiece.SentencePieceProcessor(model_proto=blob)
        except (RuntimeError, OSError) as e:
            raise TokenizerError(f"sentencepiece rejected the vocabulary: {e}") from e

    def encode(self, fragments, add_space_prefix):
        texts = []
        prev_token = True  # the text start counts as following a token
        for f in fragments:
            if isinstance(f, int):
                prev_token = True
                continue
            if add_space_prefix and prev_token:
                f = " " + f
            texts.append(f.replace(" ", SPACE_MARK))
            prev_token = False
        encoded = iter(self._sp.encode(texts, out_type=int)) if texts else iter(())
        out = []
        for f in fragments:
            if isinstance(f, int):
                out.append(f)
            else:
                out.extend(next(encoded))
        return out


# ---------------------------------------------------------------------------
# public interface
# ---------------------------------------------------------------------------


class Tokenizer:
    """Text <-> token ids for one GGUF vocabulary. Build with from_metadata."""

    def __init__(self, vocab: _Vocab, model, kind: str, pre_name: str | None):
        self._vocab = vocab
        self._model = model
        self.kind = kind            # tokenizer.ggml.model: "gpt2" or "llama"
        self.pre = pre_name         # tokenizer.ggml.pre as applied (BPE only)
        self.n_vocab = vocab.n_vocab
        self.bos_id = vocab.bos_id
        self.eos_id = vocab.eos_id
        self.eot_id = vocab.eot_id
        self.unk_id = vocab.unk_id
        self.eog_ids = vocab.eog_ids
        self.add_bos = vocab.add_bos
        self.add_eos = vocab.add_eos
        self.add_space_prefix = vocab.add_space_prefix
        self._bytes_cache = ({}, {})  # (skip_special=False, skip_special=True)

    @staticmethod
    def plan(metadata: dict) -> tuple:
        """(kind, pre-tokenizer, its name) for a vocabulary, without building
        it: raises TokenizerError for a tokenizer model or pre-tokenizer this
        package cannot run (and warns for an unknown pre-tokenizer), so a
        model whose tokenizer is built later fails at load, not mid-request."""
        kind = metadata.get(Keys.Tokenizer.MODEL)
        if kind not in SUPPORTED_MODELS:
            raise TokenizerError(
                f"unsupported tokenizer model {kind!r} ({Keys.Tokenizer.MODEL}); "
                f"supported: {', '.join(repr(k) for k in SUPPORTED_MODELS)}")
        _pieces(metadata)
        if kind in ("llama", "bert", "gemma4"):
            return kind, None, None
        pre_name = metadata.get(Keys.Tokenizer.PRE) or "default"
        pre = _PRE_BY_NAME.get(pre_name)
        if pre_name in _PRE_NOT_IMPLEMENTED:
            raise TokenizerError(f"pre-tokenizer {pre_name!r} ({Keys.Tokenizer.PRE}) is not implemented: "
                                 "llama.cpp splits it with code of its own, and no regex here gives its token ids")
        if pre is None:
            warnings.warn(f"unknown pre-tokenizer {pre_name!r} ({Keys.Tokenizer.PRE}); "
                          "using the default regexes, token ids may differ from the model's training",
                          stacklevel=3)
            pre, pre_name = _PRE_DEFAULT, "default"
        return kind, pre, pre_name

    @classmethod
    def from_metadata(cls, metadata: dict, plan: tuple | None = None) -> "Tokenizer":
        """The tokenizer of a GGUF's metadata; plan is what plan(metadata) returned, if called already."""
        kind, pre, pre_name = plan or cls.plan(metadata)
        if kind == "llama":
            vocab = _Vocab(metadata, kind, None)
            return cls(vocab, _SPMModel(vocab), kind, None)
        if kind == "gemma4":
            vocab = _Vocab(metadata, kind, None)
            return cls(vocab, _Gemma4Model(vocab, metadata), kind, None)
        if kind == "bert":
            from llminfer.text.wordpiece import WPMModel

            vocab = _Vocab(metadata, kind, None)
            return cls(vocab, WPMModel(vocab, metadata), kind, None)
        vocab = _Vocab(metadata, kind, pre)
        return cls(vocab, _BPEModel(vocab, metadata, pre), kind, pre_name)

    @classmethod
    def from_gguf(cls, path) -> "Tokenizer":
        from llminfer.core.gguf_file import GGUFFile

        return cls.from_metadata(GGUFFile(path).metadata)

    def __repr__(self):
        pre = f", pre={self.pre!r}" if self.pre else ""
        return f"Tokenizer({self.kind!r}{pre}, n_vocab={self.n_vocab})"

    # -- encoding ------------------------------------------------------------

    def encode(self, text: str, add_bos: bool = True, special: bool = False) -> list[int]:
        """Token ids for text. add_bos=True adds the special tokens the
        vocabulary asks for (BOS when add_bos, EOS when add_eos), as
        llama.cpp's add_special; special=True reads control tokens written in
        the text (e.g. "<|im_start|>") as those tokens."""
        if not isinstance(text, str):
            raise TypeError(f"encode takes str, not {type(text).__name__}")
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as e:
            raise TokenizerError(
                f"cannot encode text: {e.reason} (U+{ord(text[e.start]):04X}) at position {e.start}") from None
        ids = []
        if add_bos and self.add_bos:
            ids.append(self.bos_id)
        if text:
            fragments = _partition(self._vocab, text, special)
            ids.extend(self._model.encode(fragments, self.add_space_prefix))
        if add_bos and self.add_eos:
            ids.append(self.eos_id)
        return ids

    # -- vocabulary ----------------------------------------------------------

    def _check(self, token_id):
        if isinstance(token_id, (bool, np.bool_)) or not isinstance(token_id, (int, np.integer)):
            raise TokenError(f"token id must be an int, not {type(token_id).__name__}")
        if not 0 <= token_id < self.n_vocab:
            raise TokenError(f"token id {int(token_id)} is outside the vocabulary (0..{self.n_vocab - 1})")
        return int(token_id)

    def piece(self, token_id: int) -> str:
        """The vocabulary string of a token, e.g. "\u2581Hello" or "<0x0A>"."""
        return self._vocab.pieces[self._check(token_id)]

    def token_id(self, piece: str) -> int | None:
        """The id of a vocabulary string, or None."""
        return self._vocab.ids.get(piece)

    def is_control(self, token_id: int) -> bool:
        """Whether the token is a control (or unknown) token: one that renders
        as nothing when special tokens are skipped."""
        return bool(self._vocab.attrs[self._check(token_id)] & _A_SPECIAL)

    def token_bytes(self, token_id: int, skip_special: bool = True) -> bytes:
        """The bytes this token adds to the text (llama.cpp's token_to_piece):
        normal pieces with U+2581 as space (SentencePiece) or GPT-2 byte
        characters undone (BPE), byte tokens as their byte, user-defined
        pieces verbatim, control tokens empty unless skip_special is False."""
        tid = self._check(token_id)
        cache = self._bytes_cache[bool(skip_special)]
        out = cache.get(tid)
        if out is None:
            out = cache[tid] = self._render(tid, skip_special)
        return out

    def _render(self, tid, skip_special):
        attr = int(self._vocab.attrs[tid])
        piece = self._vocab.pieces[tid]
        if attr & _A_SPECIAL and skip_special:
            return b""
        if attr & (_A_SPECIAL | _A_USER_DEFINED):
            return piece.encode("utf-8")
        if attr & _A_NORMAL:
            if self.kind in ("llama", "bert", "gemma4"):
                return piece.replace(SPACE_MARK, " ").encode("utf-8")
            # characters outside GPT-2's table (none in a sane vocabulary) pass as UTF-8
            return b"".join(bytes((_CHAR_TO_BYTE[c],)) if c in _CHAR_TO_BYTE else c.encode("utf-8")
                            for c in piece)
        if attr & _A_BYTE:
            m = _BYTE_PIECE.fullmatch(piece)
            return bytes((int(m.group(1), 16),)) if m else b""
        return b""  # unused and undefined tokens render as nothing

    # -- decoding ------------------------------------------------------------

    def decode(self, ids, skip_special: bool = True) -> str:
        """Text for token ids; invalid UTF-8 becomes U+FFFD. With
        add_space_prefix, the space that encode put before the text (after
        any leading BOS) is taken off again."""
        d = self.stream_decoder(skip_special)
        return "".join([d.feed(t) for t in ids]) + d.flush()

    def stream_decoder(self, skip_special: bool = True) -> "StreamDecoder":
        return StreamDecoder(self, skip_special)


class StreamDecoder:
    """Decodes tokens one at a time. feed() returns only whole characters:
    bytes of a character split across tokens are held back until the token
    that completes it arrives (or flush() turns them into U+FFFD)."""

    def __init__(self, tokenizer: Tokenizer, skip_special: bool = True):
        self._tok = tokenizer
        self._skip = skip_special
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        # the leading space encode added is still to be removed
        self._strip_space = tokenizer.add_space_prefix

    def feed(self, token_id: int) -> str:
        data = self._tok.token_bytes(token_id, self._skip)
        if self._strip_space and token_id != self._tok.bos_id:
            self._strip_space = False
            if data.startswith(b" "):
                data = data[1:]
        return self._utf8.decode(data, final=False)

    def flush(self) -> str:
        out = self._utf8.decode(b"", final=True)
        self._utf8.reset()
        return out
