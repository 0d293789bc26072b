"""Structured output (llminfer.text.structured): the tokenizer bridge to llguidance,
grammars from JSON schema / GBNF / Lark, and constrained generation with
SmolLM2 whose output must parse and validate."""

import json
import re
import sys
import threading
import time

import numpy as np
import pytest

from llminfer import LLM

from llminfer.text import structured
from llminfer.errors import GrammarError, InvalidArgumentError
from llminfer.text.structured import Constraint, Grammar, grammar_from_args, ll_tokenizer
from llminfer.text.tokenizer import Tokenizer

jsonschema = pytest.importorskip("jsonschema")
pytest.importorskip("llguidance")


@pytest.fixture(scope="module")
def smollm2(smollm2_path):
    with LLM(smollm2_path, n_ctx=1024, n_threads=2) as m:
        yield m


# ---- the tokenizer bridge ----

@pytest.mark.parametrize("which", ["smollm2_path", "gemma3_path"])
def test_bridge_token_bytes(which, request):
    """llguidance sees every token's bytes as our tokenizer renders them:
    byte tokens as their byte, control tokens as specials, and a token whose
    bytes start with 0xFF (which cannot occur in UTF-8 text) as nothing."""
    tok = Tokenizer.from_gguf(request.getfixturevalue(which))
    lt = ll_tokenizer(tok)
    assert lt.vocab_size == tok.n_vocab
    n_byte, empty = 0, []
    for i in range(tok.n_vocab):
        got = lt.decode_bytes([i])
        if tok.is_control(i):
            assert lt.is_special_token(i), i
            assert got == tok.piece(i).encode("utf-8"), i
            continue
        want = tok.token_bytes(i)
        if want.startswith(b"\xff") or not want:
            empty.append(i)
            continue
        assert got == want, (i, tok.piece(i))
        n_byte += bool(re.fullmatch(r"<0x[0-9A-F]{2}>", tok.piece(i)))
    if tok.kind == "llama":
        assert n_byte == 255  # Gemma's byte-fallback tokens, all but <0xFF>
    # tokens with no bytes (or 0xFF, never in UTF-8 text) match no text at all
    allowed = Constraint(Grammar.from_regex(r"(?s:.{0,100})"), tok, tok.n_vocab).allowed()
    assert not allowed[empty].any()
    assert allowed.sum() > tok.n_vocab // 2


@pytest.mark.parametrize("which", ["smollm2_path", "gemma3_path"])
def test_bridge_tokenizes_like_the_model(which, request):
    """llguidance tokenizes forced text with our encoder, without the space a
    SentencePiece encoder puts before a whole text."""
    tok = Tokenizer.from_gguf(request.getfixturevalue(which))
    lt = ll_tokenizer(tok)
    for text in ["hello world", '{"name": "Ünïcode 😀", "n": [1, 2]}', "\n  x"]:
        ids = lt.tokenize_str(text)
        assert lt.decode_bytes(ids) == text.encode("utf-8")
        assert b"".join(tok.token_bytes(t) for t in ids) == text.encode("utf-8")
        if not tok.add_space_prefix:
            assert ids == tok.encode(text, add_bos=False)


# ---- grammars ----

def test_rejected_grammars_raise_grammar_error():
    with pytest.raises(GrammarError, match="frobnicate"):
        Grammar.from_json_schema({"type": "frobnicate"})
    with pytest.raises(GrammarError, match="not valid JSON"):
        Grammar.from_json_schema("{not json")
    with pytest.raises(GrammarError):
        Grammar.from_json_schema(["a list"])
    with pytest.raises(GrammarError):
        Grammar.from_text("root ::= undefined_rule")
    with pytest.raises(GrammarError):
        Grammar.from_text("")
    assert issubclass(GrammarError, InvalidArgumentError)


def _nested(depth, inner=None):
    schema = {"type": "integer"} if inner is None else inner
    for _ in range(depth):
        schema = {"type": "array", "items": schema}
    return schema


@pytest.mark.parametrize("schema", [_nested(5000), json.dumps({"a": 1})[:-1] + ", \"b\": " + "[" * 5000 + "]" * 5000
                                    + "}", "{\"a\":" * 5000 + "1" + "}" * 5000, _nested(200)],
                         ids=["dict-5000", "text-array-5000", "text-object-5000", "dict-200"])
def test_a_schema_nested_thousands_deep_is_a_grammar_error(schema):
    """Not a RecursionError from json: GrammarError naming the nesting."""
    with pytest.raises(GrammarError, match="nests deeper"):
        Grammar.from_json_schema(schema)
    with pytest.raises(GrammarError, match="nests deeper"):
        grammar_from_args(response_format={"type": "json_schema", "json_schema": {"schema": schema}})


def test_grammar_from_args():
    assert grammar_from_args() is None
    assert grammar_from_args(response_format={"type": "text"}) is None
    assert grammar_from_args(response_format={"type": "json_object"}).source == "json_schema"
    g = grammar_from_args(response_format={"type": "json_schema",
                                           "json_schema": {"name": "x", "schema": {"type": "integer"}}})
    assert g.source == "json_schema"
    with pytest.raises(InvalidArgumentError, match="one of"):
        grammar_from_args(grammar='root ::= "a"', json_schema={"type": "integer"})
    with pytest.raises(InvalidArgumentError, match="response_format type"):
        grammar_from_args(response_format={"type": "xml"})
    with pytest.raises(InvalidArgumentError, match="json_schema"):
        grammar_from_args(response_format={"type": "json_schema"})


def test_constraint_masks_and_consumes(smollm2):
    tok = smollm2.tokenizer
    c = Constraint(Grammar.from_text('root ::= "yes" | "no"'), tok, smollm2.n_vocab)
    allowed = c.allowed()
    assert allowed.shape == (smollm2.n_vocab,)
    texts = {tok.token_bytes(int(i)) for i in np.nonzero(allowed)[0]}
    assert texts and all(b"yes".startswith(t) or b"no".startswith(t) for t in texts)
    logits = np.zeros(smollm2.n_vocab, np.float32)
    masked = c.apply(logits)
    assert np.array_equal(np.isfinite(masked), allowed)
    with pytest.raises(GrammarError, match="not allowed"):
        c.advance(tok.encode("maybe", add_bos=False)[0])


# ---- constrained generation with a real model ----

# Every schema bounds its output (string lengths, integer ranges, item
# counts) to fewer tokens than max_tokens, so a constrained generation must
# close its JSON and end with "stop", whatever the model would ramble.
SCHEMAS = [
    {"type": "object", "properties": {"name": {"type": "string", "maxLength": 30},
                                      "age": {"type": "integer", "minimum": 0, "maximum": 150},
                                      "email": {"type": "string", "format": "email", "maxLength": 40}},
     "required": ["name", "age"], "additionalProperties": False},
    {"type": "array", "items": {"type": "integer", "minimum": -999, "maximum": 999}, "minItems": 2, "maxItems": 5},
    {"type": "object", "properties": {"city": {"enum": ["Paris", "Rome", "Berlin"]},
                                      "tags": {"type": "array", "items": {"type": "string", "maxLength": 12},
                                               "maxItems": 3},
                                      "ok": {"type": "boolean"},
                                      "nested": {"type": "object", "properties": {"x": {"type": "integer",
                                                                                        "minimum": 0,
                                                                                        "maximum": 9}},
                                                 "required": ["x"], "additionalProperties": False}},
     "required": ["city", "ok", "nested"], "additionalProperties": False},
    {"anyOf": [{"type": "string", "maxLength": 20}, {"type": "integer", "minimum": -999, "maximum": 999}]},
]
PROMPTS = ["Describe a person as JSON.", "Where should I travel?"]


@pytest.mark.parametrize("k", range(len(SCHEMAS)))
def test_json_schema_output_validates(smollm2, k):
    schema = SCHEMAS[k]
    for seed, prompt in enumerate(PROMPTS):
        out = smollm2.create_chat_completion(
            [{"role": "user", "content": prompt}], max_tokens=160, temperature=0.9, seed=seed,
            response_format={"type": "json_schema", "json_schema": {"name": "s", "schema": schema}})
        choice = out["choices"][0]
        assert choice["finish_reason"] == "stop", choice
        jsonschema.validate(json.loads(choice["message"]["content"]), schema)


def test_json_object_and_streaming(smollm2):
    msgs = [{"role": "user", "content": "Reply with a JSON object about cats."}]
    pieces, finish = [], None
    for chunk in smollm2.create_chat_completion(msgs, max_tokens=200, seed=3, temperature=0.8,
                                                response_format={"type": "json_object"}, stream=True):
        delta = chunk["choices"][0]["delta"]
        pieces.append(delta.get("content") or "")
        finish = chunk["choices"][0]["finish_reason"] or finish
    if finish == "stop":
        assert isinstance(json.loads("".join(pieces)), dict)
    else:
        assert "".join(pieces).startswith("{")


def test_generate_json_schema_and_completion(smollm2):
    schema = {"type": "integer", "minimum": 0, "maximum": 999}
    text = smollm2.generate("The number of days in a year is", json_schema=schema, max_tokens=8, temperature=0)
    jsonschema.validate(json.loads(text), schema)
    out = smollm2.create_completion("A JSON list of colours:", max_tokens=80, seed=1,
                                    response_format={"type": "json_schema",
                                                     "json_schema": {"schema": {"type": "array",
                                                                                "items": {"type": "string"},
                                                                                "maxItems": 4}}})
    if out["choices"][0]["finish_reason"] == "stop":
        assert isinstance(json.loads(out["choices"][0]["text"]), list)


def test_gbnf_and_lark_grammars(smollm2):
    gbnf = r'''
root   ::= answer " because " reason
answer ::= "yes" | "no"
reason ::= [a-z ]{3,30} "."
'''
    for seed in range(3):
        text = smollm2.generate("Is water wet? Answer:", grammar=gbnf, max_tokens=40, seed=seed)
        assert re.fullmatch(r"(yes|no) because [a-z ]{3,30}\.", text), text
    lark = 'start: "(" NUM ("," NUM)* ")"\nNUM: /[0-9]{1,3}/'
    text = smollm2.generate("Some numbers:", grammar=lark, max_tokens=40, seed=4, temperature=0.7)
    assert re.fullmatch(r"\([0-9]{1,3}(,[0-9]{1,3})*\)", text), text


def test_batched_prompts_are_constrained(smollm2):
    outs = smollm2.complete(["A colour:", "A fruit:", "An animal:"], max_tokens=12, seed=5,
                            grammar='root ::= " " ("red" | "apple" | "cat" | "dog")')
    for c in outs:
        assert c.finish_reason == "stop"
        assert c.text in (" red", " apple", " cat", " dog")


def test_overlapped_mask_gives_the_same_tokens(smollm2, monkeypatch):
    """The mask computed on the worker thread during the forward pass is the
    one computed after it: the same seed gives the same tokens either way."""
    schema = SCHEMAS[0]
    msgs = [{"role": "user", "content": "A person, as JSON."}]
    a = smollm2.chat_completion(msgs, max_tokens=80, seed=11, json_schema=schema)
    monkeypatch.setattr(structured, "OVERLAP_MASK", False)
    b = smollm2.chat_completion(msgs, max_tokens=80, seed=11, json_schema=schema)
    assert a.tokens == b.tokens


def test_bad_arguments(smollm2):
    with pytest.raises(GrammarError):
        smollm2.generate("x", json_schema={"type": "frobnicate"})
    with pytest.raises(InvalidArgumentError):
        smollm2.create_chat_completion([{"role": "user", "content": "x"}], response_format={"type": "yaml"})
    with pytest.raises(InvalidArgumentError):
        smollm2.generate("x", grammar='root ::= "a"', json_schema={"type": "integer"})


def test_decode_releases_the_gil(smollm2):
    """The native forward pass runs without the GIL, so a Python thread (the
    mask worker) makes progress while it runs. The switch interval is set so
    long that Python never takes the GIL from a thread that holds it: the
    spinning thread only runs when the main thread gives the GIL up."""
    ids = smollm2.tokenize("word " * 200)
    count = [0]
    stop = threading.Event()

    def spin():
        while not stop.is_set():
            count[0] += 1
            time.sleep(0)  # hands the GIL back at once

    eng = smollm2.engine
    real = eng.ctx.decode
    during = []

    def decode(*args):
        c0 = count[0]
        out = real(*args)
        during.append(count[0] - c0)
        return out

    seq = eng.new_sequence()
    old = sys.getswitchinterval()
    t = threading.Thread(target=spin)
    try:
        sys.setswitchinterval(1000.0)
        t.start()
        eng.ctx = _Wrapped(eng.ctx, decode)
        eng.decode([(seq, ids)])
    finally:
        stop.set()
        t.join()
        sys.setswitchinterval(old)
        if isinstance(eng.ctx, _Wrapped):
            eng.ctx = eng.ctx._inner
        eng.free(seq)
    assert during and min(during) >= 10, during


class _Wrapped:
    """A Context whose decode is replaced; everything else passes through."""

    def __init__(self, inner, decode):
        self._inner = inner
        self.decode = decode

    def __getattr__(self, name):
        return getattr(self._inner, name)
