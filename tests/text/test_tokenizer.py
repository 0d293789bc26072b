"""Tokenizer tests: real vocabularies (SmolLM2: byte-level BPE, Gemma 3:
SentencePiece) and small synthetic ones built here, plus comparisons with
llama.cpp through llama-cpp-python (marked peer) on one battery of strings.

Expected ids always come from the vocabulary itself (token_id of a piece) or
from llama.cpp, never from a list copied out of an earlier run.
"""

import codecs
import ctypes
import warnings

import numpy as np
import pytest
from gguf import TokenType

from llminfer.errors import TokenError, TokenizerError
from llminfer.core.gguf_file import GGUFFile, StringArray
from llminfer.text.tokenizer import _EOG_PIECES, _PRE_BY_NAME, _PRE_NOT_IMPLEMENTED, SPACE_MARK, Tokenizer
from tokenizer_battery import BATTERY, FLAGS


# ---------------------------------------------------------------------------
# fixtures
# ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def smollm_meta(smollm2_path):
    return GGUFFile(smollm2_path).metadata


@pytest.fixture(scope="module")
def gemma_meta(gemma3_path):
    return GGUFFile(gemma3_path).metadata


@pytest.fixture(scope="module")
def smollm(smollm_meta):
    return Tokenizer.from_metadata(smollm_meta)


@pytest.fixture(scope="module")
def gemma(gemma_meta):
    return Tokenizer.from_metadata(gemma_meta)


@pytest.fixture(scope="module", params=["smollm", "gemma"])
def real(request):
    """Each real tokenizer in turn."""
    return request.getfixturevalue(request.param)


def normalized(tok, text):
    """What a round trip gives back: SentencePiece reads U+2581 as a space."""
    return text.replace(SPACE_MARK, " ") if tok.kind == "llama" else text


# ---------------------------------------------------------------------------
# synthetic vocabularies
# ---------------------------------------------------------------------------


def _byte_pieces():
    return [f"<0x{b:02X}>" for b in range(256)]


def spm_meta(normal, scores, user_defined=(), **extra):
    """A small SentencePiece vocabulary: <unk> <s> </s>, 256 byte pieces,
    user-defined pieces, then the normal pieces with their scores."""
    pieces = ["<unk>", "<s>", "</s>"] + _byte_pieces() + list(user_defined) + list(normal)
    types = ([TokenType.UNKNOWN, TokenType.CONTROL, TokenType.CONTROL] + [TokenType.BYTE] * 256
             + [TokenType.USER_DEFINED] * len(user_defined) + [TokenType.NORMAL] * len(normal))
    all_scores = [0.0] * (3 + 256 + len(user_defined)) + list(scores)
    meta = {
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.tokens": pieces,
        "tokenizer.ggml.scores": np.array(all_scores, dtype=np.float32),
        "tokenizer.ggml.token_type": np.array([int(t) for t in types], dtype=np.int32),
    }
    meta.update(extra)
    return meta


def _gpt2_chars():
    """GPT-2's printable stand-ins for the 256 bytes, in byte order."""
    keep = set(range(0x21, 0x7F)) | set(range(0xA1, 0xAD)) | set(range(0xAE, 0x100))
    out, extra = [], 0
    for b in range(256):
        if b in keep:
            out.append(chr(b))
        else:
            out.append(chr(256 + extra))
            extra += 1
    return out


def bpe_meta(merges, pre="gpt2", controls=("<|end|>",), **extra):
    """A small byte-level BPE vocabulary: the 256 byte characters, every merge
    result, and the control tokens."""
    pieces = _gpt2_chars()
    for m in merges:
        a, b = m.split(" ")
        if a + b not in pieces:
            pieces.append(a + b)
    pieces += controls
    types = [TokenType.NORMAL] * (len(pieces) - len(controls)) + [TokenType.CONTROL] * len(controls)
    meta = {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": pre,
        "tokenizer.ggml.tokens": pieces,
        "tokenizer.ggml.token_type": np.array([int(t) for t in types], dtype=np.int32),
        "tokenizer.ggml.merges": list(merges),
    }
    meta.update(extra)
    return meta


# ---------------------------------------------------------------------------
# round trips and decoding (no peer needed)
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("text", BATTERY)
def test_round_trip(real, text):
    want = normalized(real, text)
    for add_bos in (True, False):
        assert real.decode(real.encode(text, add_bos=add_bos)) == want
    # special tokens read from the text come back when they are rendered
    assert real.decode(real.encode(text, add_bos=False, special=True), skip_special=False) == want


@pytest.mark.parametrize("text", BATTERY)
def test_stream_decoder_never_splits_a_character(real, text):
    ids = real.encode(text, add_bos=True, special=True)
    for skip in (True, False):
        d = real.stream_decoder(skip_special=skip)
        parts = [d.feed(t) for t in ids]
        parts.append(d.flush())
        # valid input never yields a replacement character
        assert all("\ufffd" not in p for p in parts)
        assert "".join(parts) == real.decode(ids, skip_special=skip)


def test_stream_decoder_holds_back_partial_bytes(real):
    """A character whose bytes are spread over several tokens appears with the
    token that completes it, and not before."""
    split = 0
    for ch in ("🎉", "👨‍👩‍👧", "\U0001d11e", "\U00020001", "日本", "\U0001fae8"):
        ids = real.encode(ch, add_bos=False)
        d = real.stream_decoder()
        fed, emitted = b"", ""
        for t in ids:
            fed += real.token_bytes(t)
            emitted += d.feed(t)
            assert fed.startswith(emitted.encode())
            pending = fed[len(emitted.encode()):]
            # whatever is held back is a strict prefix of one UTF-8 character
            if pending:
                split += 1
                assert len(pending) < 4
                with pytest.raises(UnicodeDecodeError):
                    pending.decode("utf-8")
        assert emitted + d.flush() == ch
    assert split, "no test character was split across tokens; pick rarer ones"


def test_stream_decoder_flush_replaces_incomplete_bytes(gemma):
    # the first byte token of a four-byte character, alone, is incomplete
    lead = gemma.token_id("<0xF0>")
    d = gemma.stream_decoder()
    assert d.feed(lead) == ""
    assert d.flush() == "\ufffd"
    assert gemma.decode([lead]) == "\ufffd"


def test_byte_fallback_decodes_to_the_bytes(gemma):
    # a character with no piece of its own: SentencePiece spells it in byte tokens
    byte_ids = {gemma.token_id(f"<0x{b:02X}>") for b in range(256)}
    for cp in list(range(0x20000, 0x20400)) + list(range(0x1D100, 0x1D200)):
        ch = chr(cp)
        ids = gemma.encode(ch, add_bos=False)
        if set(ids) <= byte_ids:
            break
    else:
        pytest.fail("no character without a piece found in the probe ranges")
    assert [gemma.token_bytes(t) for t in ids] == [bytes([b]) for b in ch.encode("utf-8")]
    assert gemma.decode(ids) == ch
    assert gemma.token_bytes(gemma.token_id("<0x0A>")) == b"\n"


def test_control_tokens_render_only_when_asked(real):
    for piece in ("<|im_end|>", "<end_of_turn>"):
        tid = real.token_id(piece)
        if tid is None:
            continue
        assert real.is_control(tid)
        assert real.token_bytes(tid) == b""
        assert real.token_bytes(tid, skip_special=False) == piece.encode()
        assert real.decode([tid]) == ""
        assert real.decode([tid], skip_special=False) == piece


def test_piece_and_token_id_are_inverse(real):
    for tid in (0, 1, real.n_vocab // 2, real.n_vocab - 1):
        assert real.token_id(real.piece(tid)) == tid
    assert real.token_id("no such piece \x01\x02") is None


def _fnv1a(data: bytes) -> int:
    """64-bit FNV-1a, written out from its definition (offset basis and prime)."""
    h = 0xcbf29ce484222325
    for b in data:
        h = ((h ^ b) * 0x100000001b3) & (2**64 - 1)
    return h


def test_piece_hashes_are_fnv1a():
    from llminfer import _core

    items = ["", "a", "\u2581Hello", "<0x0A>", "\u00e9\u00e8" * 40]
    arr = StringArray.of(items)
    assert arr.hashes().tolist() == [_fnv1a(s.encode()) for s in items]
    assert [_core.hash_bytes(s.encode()) for s in items] == [_fnv1a(s.encode()) for s in items]


def test_piece_index_answers_as_a_dict(real):
    """Every piece of a real vocabulary (262k for Gemma 3) maps to its id;
    absent strings, non-strings and lone surrogates are absent."""
    ids = real._vocab.ids
    pieces = real._vocab.pieces.tolist()
    assert len(ids) == len(pieces) == real.n_vocab
    step = max(1, len(pieces) // 5000)
    for tid in list(range(0, len(pieces), step)) + [len(pieces) - 1]:
        assert ids[pieces[tid]] == tid and pieces[tid] in ids
    for absent in ("no such piece \x01\x02", "\ud800", "\u2581" * 300):
        assert absent not in ids and ids.get(absent, -1) == -1
        with pytest.raises(KeyError):
            ids[absent]
    assert ids.get(5) is None and ids.get(b"a") is None


def test_piece_index_checks_bytes_when_hashes_collide(monkeypatch):
    """With every hash made equal, lookups still find each piece by its bytes,
    and a vocabulary of distinct pieces is not taken for one with duplicates."""
    monkeypatch.setattr(StringArray, "hashes", lambda self: np.zeros(len(self), np.uint64))
    from llminfer import _core

    monkeypatch.setattr(_core, "hash_bytes", lambda b: 0)
    tok = Tokenizer.from_metadata(spm_meta(["a", "b", "ab"], [-1.0, -2.0, -0.5]))
    for piece in ("a", "b", "ab", "<s>", "<0xFF>"):
        assert tok.piece(tok.token_id(piece)) == piece
    assert tok.token_id("ba") is None
    with pytest.raises(TokenizerError, match="duplicate piece 'a' in the vocabulary: ids 259 and 261"):
        Tokenizer.from_metadata(spm_meta(["a", "b", "a"], [0.0, 0.0, 0.0]))


# ---------------------------------------------------------------------------
# special tokens, BOS, EOG
# ---------------------------------------------------------------------------


def test_control_token_matched_only_with_special(real):
    chat = [p for p in ("<|im_start|>", "<|im_end|>", "<start_of_turn>", "<end_of_turn>")
            if real.token_id(p) is not None]
    assert chat, "the vocabulary has none of the chat markers"
    for piece in chat:
        tid = real.token_id(piece)
        text = f"hi{piece}there"
        with_special = real.encode(text, add_bos=False, special=True)
        assert with_special == (real.encode("hi", add_bos=False) + [tid]
                                + real.encode("there", add_bos=False))
        as_text = real.encode(text, add_bos=False, special=False)
        assert tid not in as_text
        assert real.decode(as_text) == text


def test_user_defined_tokens_are_always_matched(gemma):
    # llama.cpp cuts user-defined pieces (Gemma's HTML tags, runs of
    # newlines and spaces) out of the text even when special=False
    for piece in ("<td>", "\n\n", "   "):
        tid = gemma.token_id(piece)
        assert tid is not None and not gemma.is_control(tid)
        assert gemma.encode(piece, add_bos=False, special=False) == [tid]
        assert gemma.token_bytes(tid) == piece.encode()


def test_longest_special_token_wins(gemma):
    run = "\n" * 5
    assert gemma.encode(run, add_bos=False) == [gemma.token_id(run)]
    longest = max((p for p in ("\n" * k for k in range(1, 64)) if gemma.token_id(p) is not None), key=len)
    ids = gemma.encode(longest + "\n\n", add_bos=False)
    assert ids == [gemma.token_id(longest), gemma.token_id("\n\n")]


def test_bos_per_metadata(smollm, gemma, smollm_meta, gemma_meta):
    assert gemma.add_bos is bool(gemma_meta["tokenizer.ggml.add_bos_token"]) is True
    assert gemma.bos_id == gemma_meta["tokenizer.ggml.bos_token_id"]
    assert gemma.encode("hi")[0] == gemma.bos_id
    assert gemma.encode("hi", add_bos=False) == gemma.encode("hi")[1:]
    assert gemma.encode("") == [gemma.bos_id]
    assert gemma.encode("", add_bos=False) == []

    assert smollm.add_bos is bool(smollm_meta["tokenizer.ggml.add_bos_token"]) is False
    assert smollm.bos_id == smollm_meta["tokenizer.ggml.bos_token_id"]
    assert smollm.encode("hi") == smollm.encode("hi", add_bos=False)
    assert smollm.encode("") == []

    # the metadata key decides; without it, the vocabulary kind's default
    forced = Tokenizer.from_metadata(dict(smollm_meta, **{"tokenizer.ggml.add_bos_token": True}))
    assert forced.encode("hi") == [smollm.bos_id] + smollm.encode("hi")
    no_key = {k: v for k, v in gemma_meta.items() if k != "tokenizer.ggml.add_bos_token"}
    assert Tokenizer.from_metadata(no_key).add_bos is True  # SentencePiece default
    no_key = {k: v for k, v in smollm_meta.items() if k != "tokenizer.ggml.add_bos_token"}
    assert Tokenizer.from_metadata(no_key).add_bos is False  # smollm pre-tokenizer default
    llama3 = dict(no_key, **{"tokenizer.ggml.pre": "llama-bpe"})
    assert Tokenizer.from_metadata(llama3).add_bos is True  # llama3 family default


def test_eos_appended_when_vocabulary_asks(gemma_meta):
    tok = Tokenizer.from_metadata(dict(gemma_meta, **{"tokenizer.ggml.add_eos_token": True}))
    ids = tok.encode("hi")
    assert ids[0] == tok.bos_id and ids[-1] == tok.eos_id
    assert tok.encode("hi", add_bos=False)[-1] != tok.eos_id


def test_eog_ids(smollm, gemma, smollm_meta, gemma_meta):
    for tok, meta in ((smollm, smollm_meta), (gemma, gemma_meta)):
        assert tok.eos_id == meta["tokenizer.ggml.eos_token_id"]
        assert tok.eos_id in tok.eog_ids
        assert all(tok.is_control(t) for t in tok.eog_ids)
    assert smollm.token_id("<|im_end|>") in smollm.eog_ids
    assert smollm.token_id("<|im_start|>") not in smollm.eog_ids
    assert gemma.token_id("<end_of_turn>") in gemma.eog_ids
    assert gemma.eot_id == gemma.token_id("<end_of_turn>")
    assert gemma.token_id("<start_of_turn>") not in gemma.eog_ids


# ---------------------------------------------------------------------------
# synthetic vocabularies: the algorithms themselves
# ---------------------------------------------------------------------------


def test_spm_merges_by_score():
    # "ab" with the space prefix is "▁ab": the pair whose merged piece scores
    # higher merges first
    normal = ["\u2581", "a", "b", "\u2581a", "ab"]
    for score_sa, score_ab, want in ((-5.0, -1.0, ["\u2581", "ab"]), (-1.0, -5.0, ["\u2581a", "b"])):
        tok = Tokenizer.from_metadata(spm_meta(normal, [-3.0, -3.0, -3.0, score_sa, score_ab]))
        assert tok.encode("ab", add_bos=False) == [tok.token_id(p) for p in want]


def test_spm_space_prefix_and_byte_fallback():
    normal = ["\u2581", "a", "b", "\u2581a", "ab", "\u2581ab"]
    meta = spm_meta(normal, [-1.0] * len(normal), user_defined=["<sep>"])
    tok = Tokenizer.from_metadata(meta)
    assert tok.add_bos and tok.add_space_prefix and tok.bos_id == tok.token_id("<s>")
    ids = tok.encode("ab é")
    e_bytes = [tok.token_id(f"<0x{b:02X}>") for b in "é".encode()]
    assert ids == [tok.bos_id, tok.token_id("\u2581ab"), tok.token_id("\u2581")] + e_bytes
    assert tok.decode(ids) == "ab é"
    # a space goes before each fragment that follows a token, as in llama.cpp
    sep = tok.token_id("<sep>")
    ids = tok.encode("ab<sep>ab", add_bos=False)
    assert ids == [tok.token_id("\u2581ab"), sep, tok.token_id("\u2581ab")]
    without = Tokenizer.from_metadata(dict(meta, **{"tokenizer.ggml.add_space_prefix": False}))
    assert without.encode("ab", add_bos=False) == [without.token_id("ab")]


def test_bpe_merges_by_rank():
    for merges, want in ((["a b", "b c"], ["ab", "c"]), (["b c", "a b"], ["a", "bc"])):
        tok = Tokenizer.from_metadata(bpe_meta(merges))
        assert tok.encode("abc", add_bos=False) == [tok.token_id(p) for p in want]
        assert tok.decode(tok.encode("abc")) == "abc"


def test_bpe_byte_level_decoding():
    tok = Tokenizer.from_metadata(bpe_meta(["\u0120 a"]))  # "Ġ" stands for the space byte
    ids = tok.encode(" a é\n", add_bos=False)
    assert ids[0] == tok.token_id("\u0120a")
    assert b"".join(tok.token_bytes(t) for t in ids) == " a é\n".encode()
    control = tok.token_id("<|end|>")
    assert tok.encode("x<|end|>", add_bos=False, special=True)[-1] == control
    assert tok.decode([control]) == "" and tok.decode([control], skip_special=False) == "<|end|>"


# ---------------------------------------------------------------------------
# errors
# ---------------------------------------------------------------------------


def test_unsupported_model_names_the_supported_ones():
    meta = spm_meta(["a"], [0.0], **{"tokenizer.ggml.model": "t5"})
    with pytest.raises(TokenizerError, match="'t5'") as e:
        Tokenizer.from_metadata(meta)
    assert "'gpt2'" in str(e.value) and "'llama'" in str(e.value) and "'bert'" in str(e.value)
    with pytest.raises(TokenizerError, match="None"):
        Tokenizer.from_metadata({})


def test_unknown_pre_tokenizer_falls_back_to_default():
    with pytest.warns(UserWarning, match="unknown pre-tokenizer 'no-such-pre'"):
        tok = Tokenizer.from_metadata(bpe_meta(["3 4"], pre="no-such-pre"))
    assert tok.pre == "default"
    # the default regexes cut digit runs into threes, so "1234" is "123" "4"
    # and the merge 3+4 cannot apply; GPT-2's keep the run whole
    assert tok.encode("1234", add_bos=False) == [tok.token_id(c) for c in "1234"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a known name: no warning
        gpt2 = Tokenizer.from_metadata(bpe_meta(["3 4"], pre="gpt2"))
    assert gpt2.encode("1234", add_bos=False) == [gpt2.token_id(p) for p in ("1", "2", "34")]


def substring_merges(texts, max_len, forbidden=()):
    """Byte-level BPE merges that make every piece of up to max_len byte
    characters in the texts a token, shorter pieces ranked first, each built
    from its first character and the rest or from all but its last one. They
    cross every place a regex may cut (space-letter, letter-digit, digit
    runs, case changes, newlines), so tokens line up with the pre-tokenizer's
    pieces and two pre-tokenizers that split a text differently give
    different ids. No merge makes a piece in forbidden."""
    chars = _gpt2_chars()
    merges, seen = [], set()
    for n in range(2, max_len + 1):
        for text in texts:
            line = "".join(chars[b] for b in text.encode("utf-8"))
            for i in range(len(line) - n + 1):
                piece = line[i:i + n]
                if piece in seen or any(f in piece for f in forbidden):
                    continue
                seen.add(piece)
                merges.append(f"{piece[0]} {piece[1:]}")
                if n > 2:
                    merges.append(f"{piece[:-1]} {piece[-1]}")
    # a merge whose parts never both became tokens can never apply: drop it
    tokens = set(chars) | seen
    return [m for m in merges if all(part in tokens for part in m.split(" "))]


# the battery's chat markup as control tokens
_CONTROLS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")


def battery_merges(max_len):
    # no piece may spell a control or end-of-generation token: llama.cpp treats
    # those texts as control tokens wherever they sit in a vocabulary
    return substring_merges(BATTERY, max_len,
                            forbidden=set(_CONTROLS) | _EOG_PIECES)


def battery_meta(merges, pre):
    meta = bpe_meta(merges, pre=pre, controls=_CONTROLS)
    meta["tokenizer.ggml.bos_token_id"] = meta["tokenizer.ggml.tokens"].index("<|endoftext|>")
    return meta


@pytest.mark.parametrize("pre", sorted(_PRE_BY_NAME))
def test_every_pre_tokenizer_round_trips(pre):
    """Every known pre-tokenizer name builds (its regexes compile) and gives
    back every battery string; the ids do not depend on how texts are batched."""
    tok = Tokenizer.from_metadata(battery_meta(battery_merges(4), pre))
    assert tok.pre == pre
    for text in BATTERY:
        ids = tok.encode(text, add_bos=False)
        assert tok.decode(ids) == text
        assert all(0 <= i < tok.n_vocab for i in ids)
    # a battery-merged vocabulary tokenizes its texts in fewer tokens than bytes
    whole = "".join(BATTERY[:10])
    assert len(tok.encode(whole, add_bos=False)) < len(whole.encode("utf-8"))


def test_case_splitting_pre_tokenizers():
    """tekken and gpt-4o cut a word where its case changes, qwen2 does not; the
    gpt-4o family keeps digits in threes, qwen2 and tekken one at a time."""
    merges = ["l C", "1 2", "12 3"]

    def pieces(pre, text):
        tok = Tokenizer.from_metadata(bpe_meta(merges, pre=pre))
        return [tok.piece(i) for i in tok.encode(text, add_bos=False)]

    assert pieces("qwen2", "CamelCase") == ["C", "a", "m", "e", "lC", "a", "s", "e"]
    for pre in ("tekken", "gpt-4o", "llama4"):
        assert "lC" not in pieces(pre, "CamelCase")
    assert pieces("gpt-4o", "1234") == ["123", "4"]
    assert pieces("qwen2", "123") == pieces("tekken", "123") == ["1", "2", "3"]


@pytest.mark.parametrize("pre", sorted(_PRE_NOT_IMPLEMENTED))
def test_pre_tokenizers_without_regexes_are_refused(pre):
    with pytest.raises(TokenizerError, match=f"pre-tokenizer '{pre}'.*not implemented"):
        Tokenizer.from_metadata(bpe_meta(["a b"], pre=pre))


def test_bad_vocabularies():
    with pytest.raises(TokenizerError, match="merges"):
        Tokenizer.from_metadata({k: v for k, v in bpe_meta([]).items() if k != "tokenizer.ggml.merges"})
    meta = spm_meta(["a", "a"], [0.0, 0.0])
    with pytest.raises(TokenizerError, match="duplicate piece 'a'"):
        Tokenizer.from_metadata(meta)
    # SentencePiece wants BOS by default (id 1 unless named); a one-token
    # vocabulary has no id 1, and an out-of-range id in the metadata is ignored
    one = {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": ["<unk>"],
           "tokenizer.ggml.token_type": np.array([int(TokenType.UNKNOWN)], np.int32),
           "tokenizer.ggml.bos_token_id": 10**6}
    with pytest.raises(TokenizerError, match="no BOS token"):
        Tokenizer.from_metadata(one)
    assert Tokenizer.from_metadata(dict(one, **{"tokenizer.ggml.add_bos_token": False})).bos_id is None
    meta = spm_meta(["a"], [0.0])
    meta["tokenizer.ggml.scores"] = meta["tokenizer.ggml.scores"][:5]
    with pytest.raises(TokenizerError, match="tokenizer.ggml.scores has 5 entries"):
        Tokenizer.from_metadata(meta)


def test_out_of_range_ids(real):
    for bad in (real.n_vocab, -1, 10**12):
        with pytest.raises(TokenError, match=f"token id {bad} is outside the vocabulary"):
            real.decode([0, bad])
        with pytest.raises(TokenError):
            real.token_bytes(bad)
        with pytest.raises(TokenError):
            real.piece(bad)
        with pytest.raises(TokenError):
            real.stream_decoder().feed(bad)
    with pytest.raises(TokenError, match="must be an int"):
        real.decode(["1"])


def test_unencodable_text_names_the_position(real):
    with pytest.raises(TokenizerError, match=r"surrogate.*U\+D800.*position 5"):
        real.encode("hello\ud800world")
    with pytest.raises(TypeError):
        real.encode(b"bytes")


# ---------------------------------------------------------------------------
# the SentencePiece proto written from the GGUF arrays
# ---------------------------------------------------------------------------


def test_sentencepiece_proto_holds_every_piece(gemma, gemma_meta):
    sp = gemma._model._sp
    assert sp.get_piece_size() == gemma.n_vocab
    pieces = gemma_meta["tokenizer.ggml.tokens"]
    scores = gemma_meta["tokenizer.ggml.scores"]
    got_pieces = [sp.id_to_piece(i) for i in range(gemma.n_vocab)]
    assert got_pieces == pieces
    got_scores = np.array([sp.get_score(i) for i in range(gemma.n_vocab)], dtype=np.float32)
    np.testing.assert_array_equal(got_scores, scores)


# ---------------------------------------------------------------------------
# parity with llama.cpp (llama-cpp-python)
# ---------------------------------------------------------------------------


def _llama(path):
    import llama_cpp

    return llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)


def _mismatches(tok, llama, texts=BATTERY):
    bad = []
    for text in texts:
        for add_bos, special in FLAGS:
            ours = tok.encode(text, add_bos=add_bos, special=special)
            theirs = llama.tokenize(text.encode("utf-8"), add_bos=add_bos, special=special)
            if ours != theirs:
                bad.append((text, add_bos, special, ours, theirs))
    return bad


@pytest.mark.peer
@pytest.mark.parametrize("which", ["smollm", "gemma"])
def test_ids_match_llama_cpp(request, which):
    path = request.getfixturevalue({"smollm": "smollm2_path", "gemma": "gemma3_path"}[which])
    tok = request.getfixturevalue(which)
    assert _mismatches(tok, _llama(path)) == []


@pytest.mark.peer
@pytest.mark.parametrize("which", ["smollm", "gemma"])
def test_vocabulary_matches_llama_cpp(request, which):
    """Every token renders to llama.cpp's bytes, both ways; special ids and
    end-of-generation set agree."""
    import llama_cpp

    path = request.getfixturevalue({"smollm": "smollm2_path", "gemma": "gemma3_path"}[which])
    tok = request.getfixturevalue(which)
    llama = _llama(path)
    vocab = llama_cpp.llama_model_get_vocab(llama.model)
    assert llama_cpp.llama_vocab_n_tokens(vocab) == tok.n_vocab
    assert llama_cpp.llama_vocab_bos(vocab) == tok.bos_id
    assert llama_cpp.llama_vocab_eos(vocab) == tok.eos_id
    assert bool(llama_cpp.llama_vocab_get_add_bos(vocab)) == tok.add_bos
    assert bool(llama_cpp.llama_vocab_get_add_eos(vocab)) == tok.add_eos
    eog = {t for t in range(tok.n_vocab) if llama_cpp.llama_vocab_is_eog(vocab, t)}
    assert eog == set(tok.eog_ids)

    buf = ctypes.create_string_buffer(1024)
    bad = []
    for t in range(tok.n_vocab):
        for special in (False, True):
            n = llama_cpp.llama_token_to_piece(vocab, t, buf, len(buf), 0, special)
            if buf.raw[:n] != tok.token_bytes(t, skip_special=not special):
                bad.append((t, special))
    assert bad == []

    # whole sequences, through llama.cpp's detokenizer
    out = ctypes.create_string_buffer(1 << 16)
    for text in BATTERY:
        ids = tok.encode(text, add_bos=True, special=True)
        arr = (llama_cpp.llama_token * max(len(ids), 1))(*ids)
        for special in (False, True):
            n = llama_cpp.llama_detokenize(vocab, arr, len(ids), out, len(out), False, special)
            theirs = codecs.decode(out.raw[:n], "utf-8", "replace")
            assert tok.decode(ids, skip_special=not special) == theirs, (text, special)


def _write_vocab_gguf(path, metadata, **override):
    """A GGUF with the model's metadata (no tensors), some keys replaced: lets
    llama.cpp load vocabularies we have no model file for."""
    from gguf import GGUFValueType, GGUFWriter

    meta = dict(metadata, **override)
    w = GGUFWriter(str(path), meta["general.architecture"])
    for key, v in meta.items():
        if key == "general.architecture":
            continue
        if isinstance(v, bool):
            w.add_key_value(key, v, GGUFValueType.BOOL)
        elif isinstance(v, int):
            w.add_key_value(key, v, GGUFValueType.UINT32)
        elif isinstance(v, float):
            w.add_key_value(key, v, GGUFValueType.FLOAT32)
        elif isinstance(v, str):
            w.add_key_value(key, v, GGUFValueType.STRING)
        elif isinstance(v, np.ndarray):
            sub = GGUFValueType.INT32 if v.dtype.kind in "iu" else GGUFValueType.FLOAT32
            w.add_key_value(key, v.tolist(), GGUFValueType.ARRAY, sub)
        elif isinstance(v, (list, StringArray)):
            w.add_key_value(key, list(v), GGUFValueType.ARRAY, GGUFValueType.STRING)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.mark.peer
@pytest.mark.parametrize("pre", sorted(set(_PRE_BY_NAME) - {"gpt2"}))  # "gpt2": our alias, not llama.cpp's
def test_pre_tokenizers_match_llama_cpp(smollm_meta, tmp_path, pre):
    """Every known pre-tokenizer name, under two vocabularies: SmolLM2's (real
    merges, learnt after its own splitting) and one learnt on the battery with
    no splitting at all, whose merges cross every place a regex may cut. Both
    give llama.cpp's ids for every battery string and flag combination."""
    path = _write_vocab_gguf(tmp_path / f"{pre}.gguf", smollm_meta, **{"tokenizer.ggml.pre": pre})
    tok = Tokenizer.from_metadata(GGUFFile(path).metadata)
    assert tok.pre == pre
    assert _mismatches(tok, _llama(path)) == []

    model_keys = {k: v for k, v in smollm_meta.items() if not k.startswith("tokenizer.")}
    path = _write_vocab_gguf(tmp_path / f"{pre}-battery.gguf", model_keys, **battery_meta(battery_merges(8), pre))
    tok = Tokenizer.from_metadata(GGUFFile(path).metadata)
    assert _mismatches(tok, _llama(path)) == []


@pytest.mark.peer
def test_space_prefix_matches_llama_cpp(gemma_meta, tmp_path):
    """Gemma's vocabulary with add_space_prefix (as Llama 2 style vocabularies
    have it) and EOS added: the space goes before each fragment as llama.cpp puts it."""
    override = {"tokenizer.ggml.add_space_prefix": True, "tokenizer.ggml.add_eos_token": True}
    path = _write_vocab_gguf(tmp_path / "gemma-prefix.gguf", gemma_meta, **override)
    tok = Tokenizer.from_metadata(GGUFFile(path).metadata)
    assert tok.add_space_prefix and tok.add_eos
    assert _mismatches(tok, _llama(path)) == []
