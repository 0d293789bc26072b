"""Embeddings (llminfer.generation.embeddings, csrc/encoder.c): the bert and nomic-bert
encoders against the numpy reference on tiny random GGUFs, pooling and
normalization, decoder-model embeddings against the reference's hidden
states, the WordPiece tokenizer, errors, and (peer) llama.cpp's embeddings
of the same files."""

import numpy as np
import pytest

from llminfer import LLM, Embedder, _core
from llminfer.generation.embeddings import l2_normalize, pool
from llminfer.errors import ContextFullError, InvalidArgumentError, TokenError, UnsupportedModelError
from llminfer.text.wordpiece import words
from reference import ReferenceModel
from tiny_models import TinyConfig, write_encoder, write_model

TEXT = "The cat sat on the mat, embedding!"
TEXTS = [TEXT, "a good dog ran", "Is the mat good? 42"]


@pytest.fixture(scope="module")
def encoders(tmp_path_factory):
    d = tmp_path_factory.mktemp("encoders")
    out = {}
    for arch in ("bert", "nomic-bert"):
        for qtype in ("F32", "Q8_0"):
            out[arch, qtype] = write_encoder(d / f"{arch}-{qtype}.gguf", arch=arch, qtype=qtype)
    out["cls"] = write_encoder(d / "bert-cls.gguf", pooling=2)
    out["last"] = write_encoder(d / "bert-last.gguf", arch="nomic-bert", pooling=3)
    return out


# tolerance on hidden states of unit-variance rows: F32 weights differ from
# float64 by rounding and ggml's f16 GELU table; Q8_0 also rounds the
# activations to 8 bits per block
TOL = {"F32": 3e-3, "Q8_0": 0.1}


@pytest.mark.parametrize("arch", ["bert", "nomic-bert"])
@pytest.mark.parametrize("qtype", ["F32", "Q8_0"])
def test_encoder_matches_reference(encoders, arch, qtype):
    path = encoders[arch, qtype]
    ref = ReferenceModel(path)
    with Embedder(path, n_threads=2) as e:
        for text in TEXTS:
            ids = e.tokenizer.encode(text)
            got = e.desc.encode(np.asarray(ids, np.int32), None, 2)
            want = ref.encoder(ids)
            assert got.shape == want.shape
            np.testing.assert_allclose(got, want, atol=TOL[qtype], rtol=0)
            # pooled and normalized as the GGUF says (mean)
            v = np.array(e.embed(text))
            w = want.mean(axis=0)
            w /= np.linalg.norm(w)
            assert abs(np.linalg.norm(v) - 1) < 1e-5
            assert float(v @ w) > (0.99999 if qtype == "F32" else 0.999)


def test_rows_depend_on_their_sequence_only(encoders):
    """Thread count and what else is embedded change nothing, bit for bit."""
    with Embedder(encoders["bert", "Q8_0"], n_threads=1) as e:
        ids = np.asarray(e.tokenizer.encode(TEXT), np.int32)
        one = e.desc.encode(ids, None, 1)
        assert np.array_equal(one, e.desc.encode(ids, None, 3))
        alone = [e.embed(t) for t in TEXTS]
        assert e.embed(TEXTS) == alone


def test_pooling_kinds(encoders):
    with Embedder(encoders["cls"]) as e:
        assert e.pooling == "cls"
        ids = e.tokenizer.encode(TEXT)
        h = e.desc.encode(np.asarray(ids, np.int32), None, 1)
        np.testing.assert_allclose(e.embed(TEXT), l2_normalize(h[0]), rtol=0, atol=1e-6)
        np.testing.assert_allclose(e.embed(TEXT, normalize=False), h[0], rtol=0, atol=1e-6)
        tokens = e.embed(TEXT, pooling="none", normalize=False)
        assert np.array(tokens).shape == h.shape
    with Embedder(encoders["last"]) as e:
        assert e.pooling == "last"
        h = e.desc.encode(np.asarray(e.tokenizer.encode(TEXT), np.int32), None, 1)
        np.testing.assert_allclose(e.embed(TEXT), l2_normalize(h[-1]), rtol=0, atol=1e-6)
    h = np.arange(12, dtype=np.float32).reshape(3, 4)
    assert np.array_equal(pool(h, "mean"), h.mean(axis=0))
    with pytest.raises(InvalidArgumentError):
        pool(h, "max")


def test_openai_shape(encoders):
    with Embedder(encoders["nomic-bert", "Q8_0"]) as e:
        out = e.create_embedding(TEXTS)
        assert out["object"] == "list" and len(out["data"]) == 3
        for i, d in enumerate(out["data"]):
            assert d["object"] == "embedding" and d["index"] == i and len(d["embedding"]) == 256
        n = sum(len(e.tokenizer.encode(t)) for t in TEXTS)
        assert out["usage"] == {"prompt_tokens": n, "total_tokens": n}
        assert isinstance(e.embed("one")[0], float)


def test_errors(encoders, tmp_path):
    path = encoders["bert", "Q8_0"]
    with Embedder(path) as e:
        with pytest.raises(InvalidArgumentError):
            e.embed([[]])  # no tokens at all ("" is [CLS] [SEP])
        with pytest.raises(InvalidArgumentError):
            e.embed(3.5)
        with pytest.raises(ContextFullError):
            e.embed("cat " * 100, truncate=False)
        assert len(e.embed("cat " * 100)) == 256  # cut to the 64 positions, [SEP] kept
        with pytest.raises(InvalidArgumentError):
            e.embed([[1, 2, 100000]])
        with pytest.raises(InvalidArgumentError):
            e.embed(TEXT, pooling="max")
        with pytest.raises(TokenError):  # the C core checks ids itself
            e.desc.encode(np.array([101, 5000, 102], np.int32), None, 1)
        with pytest.raises(InvalidArgumentError):
            e.desc.encode(np.array([101, 102], np.int32), np.array([0, 7], np.int32), 1)
        with pytest.raises(ContextFullError):
            e.desc.encode(np.full(65, 104, np.int32), None, 1)
    with pytest.raises(UnsupportedModelError, match="Embedder"):
        LLM(path)


def test_wordpiece():
    assert words("Hello, World!  naïve 東京", True, True) == ["hello", ",", "world", "!", "naive", "東", "京"]
    assert words("Hello", False, False) == ["Hello"]
    assert words("a\x00b\u200bc", True, True) == ["abc"]


def test_wordpiece_tokens(encoders):
    with Embedder(encoders["bert", "F32"]) as e:
        tok = e.tokenizer
        ids = tok.encode("The cats sat, 42 xyzq!")
        assert ids[0] == 101 and ids[-1] == 102
        pieces = [tok.piece(i) for i in ids[1:-1]]
        assert pieces[:4] == ["\u2581the", "\u2581cat", "s", "\u2581sat"]
        assert pieces[4] == "\u2581,"
        assert pieces[5] == "[UNK]"  # "42": no piece starts a word with a digit
        assert tok.decode(ids) == " the cats sat , xyzq !"


def test_decoder_embeddings(tmp_path):
    path = write_model(tmp_path / "llama.gguf", TinyConfig(arch="llama", qtype="F32", embd_qtype="F32"))
    ref = ReferenceModel(path)
    with LLM(path, n_ctx=64, n_threads=2) as llm:
        llm.generate("the", max_tokens=2, temperature=0)
        held = llm.tokens
        ids = llm.tokenize("the sea is there")
        v = np.array(llm.embed("the sea is there"))
        want = ref.hidden(ids).mean(axis=0)
        want /= np.linalg.norm(want)
        assert float(v @ want) > 0.99999
        assert llm.tokens == held  # the context is untouched
        last = np.array(llm.embed("the sea is there", pooling="last", normalize=False))
        np.testing.assert_allclose(last, ref.hidden(ids)[-1], rtol=0, atol=2e-3)
        out = llm.create_embedding(["a", "b"])
        assert [d["index"] for d in out["data"]] == [0, 1]
        # generation still gives logits after embeddings ran
        assert llm.eval(ids[:2]).shape == (2, llm.n_vocab)
    with Embedder(path, n_threads=1) as e:
        assert e.pooling == "mean"
        assert np.allclose(e.embed("the sea is there"), v, atol=1e-6)


@pytest.mark.peer
@pytest.mark.parametrize("arch", ["bert", "nomic-bert"])
def test_llama_cpp_embeddings_agree(encoders, arch):
    llama_cpp = pytest.importorskip("llama_cpp")
    path = encoders[arch, "Q8_0"]
    peer = llama_cpp.Llama(model_path=path, embedding=True, n_ctx=64, n_threads=2, verbose=False)
    with Embedder(path, n_threads=2) as e:
        for text in TEXTS:
            assert e.tokenizer.encode(text) == peer.tokenize(text.encode(), add_bos=True, special=False)
            ours, theirs = np.array(e.embed(text)), np.array(peer.embed(text, normalize=True))
            assert float(ours @ theirs) > 0.9999
            np.testing.assert_allclose(ours, theirs, atol=1e-3, rtol=0)
