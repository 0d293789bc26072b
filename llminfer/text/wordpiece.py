"""WordPiece (llama.cpp's "WPM", tokenizer.ggml.model = "bert"): the
tokenizer of BERT-family embedding models (all-MiniLM, bge, nomic-embed-text).

As llama.cpp does it: the text is split into words at whitespace and
around punctuation, ASCII symbols and CJK characters (control characters
dropped; with the normalizer's lowercase option the text is lowercased and,
with strip_accents, decomposed and stripped of combining marks); each word,
written with a leading "\u2581", is cut into the longest vocabulary pieces
from the left. GGUF vocabularies write word-initial pieces with "\u2581" and
continuations bare (the converter's form of BERT's "##"). A word that cannot
be cut becomes [UNK].
"""

from __future__ import annotations

import unicodedata

SPACE_MARK = "\u2581"


def _is_cjk(cp: int) -> bool:
    return (0x4E00 <= cp <= 0x9FFF or 0x3400 <= cp <= 0x4DBF or 0x20000 <= cp <= 0x2A6DF
            or 0x2A700 <= cp <= 0x2B73F or 0x2B740 <= cp <= 0x2B81F or 0x2B820 <= cp <= 0x2CEAF
            or 0xF900 <= cp <= 0xFAFF or 0x2F800 <= cp <= 0x2FA1F)


def words(text: str, lowercase: bool, strip_accents: bool) -> list:
    if strip_accents:
        text = unicodedata.normalize("NFD", text)
    out, cur = [], []
    for ch in text:
        if ch.isspace():
            if cur:
                out.append("".join(cur))
                cur = []
            continue
        cat = unicodedata.category(ch)
        cp = ord(ch)
        if cp == 0 or cp == 0xFFFD or cat.startswith("C"):
            continue
        if strip_accents and cat == "Mn":
            continue
        s = ch.lower() if lowercase else ch
        if cat.startswith("P") or (cp < 0x7F and cat.startswith("S")) or _is_cjk(cp):
            if cur:
                out.append("".join(cur))
                cur = []
            out.append(s)
        else:
            cur.append(s)
    if cur:
        out.append("".join(cur))
    return out


class WPMModel:
    """The encoder over a _Vocab's pieces (llminfer.text.tokenizer)."""

    def __init__(self, vocab, metadata: dict):
        self._ids = vocab.ids.to_dict()  # looked up per character of every word
        self._unk = vocab.unk_id
        self._max_len = max(len(p) for p in vocab.pieces)
        self.lowercase = bool(metadata.get("tokenizer.ggml.normalizer.lowercase", False))
        self.strip_accents = bool(metadata.get("tokenizer.ggml.normalizer.strip_accents", self.lowercase))

    def encode_word(self, word: str) -> list:
        w = SPACE_MARK + word
        n, i, out = len(w), 0, []
        while i < n:
            for j in range(min(n, i + self._max_len + 1), i, -1):
                tid = self._ids.get(w[i:j])
                if tid is not None:
                    out.append(tid)
                    i = j
                    break
            else:
                return [self._unk] if self._unk is not None else []
        return out

    def encode(self, fragments, add_space_prefix):
        out = []
        for f in fragments:
            if isinstance(f, int):
                out.append(f)
                continue
            for w in words(f, self.lowercase, self.strip_accents):
                out.extend(self.encode_word(w))
        return out
