"""Structured output: generation constrained by a grammar, with llguidance.

    g = Grammar.from_json_schema({"type": "object", "properties": {...}})
    g = Grammar.from_text(gbnf_or_lark)          # llama.cpp's GBNF, or Lark
    text = llm.generate(prompt, json_schema=schema)
    llm.create_chat_completion(msgs, response_format={"type": "json_object"})

A Grammar is compiled and checked once (GrammarError if llguidance rejects
it). Each generation gets a Constraint: an llguidance matcher that, after
every sampled token, yields the bitmask of the tokens the grammar allows
next. Logits outside the mask become -inf before the sampling chain runs, so
whatever the chain keeps is a valid continuation, and a generation that ends
with "stop" is a whole sentence of the grammar (one that ends at max_tokens
may be cut short).

Speed: the mask for step t+1 is computed on a worker thread while the
forward pass of step t runs on the caller's thread; both release the GIL
(llminfer._core's decode runs `nogil`, llguidance drops the GIL in
compute_mask). The caller only waits when the mask takes longer than the
forward pass. bench/structured.py measures the cost.

llguidance sees our vocabulary through a bridge (`ll_tokenizer`): each
token's bytes as llminfer.text.tokenizer renders them (SentencePiece spaces,
GPT-2 byte characters undone, <0xNN> byte tokens as their byte), control
tokens as 0xFF + their text (llguidance's marker for special tokens), and
our encoder for the text llguidance tokenizes itself. A token whose bytes
start with 0xFF (Gemma's <0xFF>, GPT-2's byte for it) would read as that
marker; the byte never occurs in UTF-8 text, so such a token gets no bytes
and is never allowed.
"""

from __future__ import annotations

import json
import threading
import weakref
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from llminfer.text import jsonlimits
from llminfer.errors import GrammarError, InvalidArgumentError

__all__ = ["Grammar", "Constraint", "ll_tokenizer", "grammar_from_args"]

# Compact, deterministic JSON: no free whitespace, so a small model cannot
# wander into endless spaces or newlines; separators as json.dumps writes them.
_JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


def _llguidance():
    try:
        import llguidance
    except ImportError:  # pragma: no cover - a dependency, absent only in a broken install
        raise GrammarError("structured output needs the llguidance package: pip install llguidance") from None
    return llguidance


# ---- the tokenizer bridge ----

class _VocabWrapper:
    """What llguidance.LLTokenizer reads from a tokenizer object: the bytes of
    every token, the EOS/BOS ids, and a callable str -> ids."""

    is_tokenizer_wrapper = True

    def __init__(self, tokenizer, n_vocab: int):
        self._tok = tokenizer
        toks = []
        for i in range(tokenizer.n_vocab):
            if tokenizer.is_control(i):
                # control and unknown tokens: llguidance's marker for special tokens
                toks.append(b"\xff" + tokenizer.piece(i).encode("utf-8"))
            else:
                data = tokenizer.token_bytes(i, skip_special=True)
                # 0xFF would read as llguidance's special marker; the byte is
                # never part of UTF-8 text, so such a token (<0xFF>, GPT-2's
                # "\u00ff") can never be allowed: give it no bytes
                toks.append(b"" if data.startswith(b"\xff") else data)
        # a model's output matrix may have rows past the vocabulary: never allowed
        toks.extend(b"" for _ in range(n_vocab - len(toks)))
        self.tokens = toks
        eog = sorted(tokenizer.eog_ids)
        eos = tokenizer.eos_id if tokenizer.eos_id in tokenizer.eog_ids else (eog[0] if eog else None)
        self.eos_token_id = eos
        self.bos_token_id = tokenizer.bos_id
        self.special_token_ids = [i for i in range(tokenizer.n_vocab) if tokenizer.is_control(i)]

    def __call__(self, text: str) -> list:
        tok = self._tok
        ids = tok.encode(text, add_bos=False, special=False)
        if tok.add_space_prefix and ids and not text.startswith(" "):
            # A SentencePiece encoder puts a space before the text; llguidance
            # tokenizes pieces from the middle of a text, where there is none.
            first = tok.token_bytes(ids[0])
            if first.startswith(b" "):
                rest = first[1:]
                if not rest:
                    ids = ids[1:]
                else:
                    same = tok.token_id(rest.decode("utf-8", "replace").replace(" ", "\u2581"))
                    ids = ([same] if same is not None else _byte_ids(tok, rest)) + ids[1:]
        return ids


def _byte_ids(tok, data: bytes) -> list:
    """Byte tokens (<0xNN>) spelling data, where the vocabulary has them."""
    out = []
    for b in data:
        t = tok.token_id(f"<0x{b:02X}>")
        if t is None:
            return tok.encode(data.decode("utf-8", "replace"), add_bos=False)
        out.append(t)
    return out


_bridges: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
_bridges_lock = threading.Lock()


def ll_tokenizer(tokenizer, n_vocab: int | None = None):
    """The llguidance.LLTokenizer for one of our Tokenizers (built once per
    tokenizer and vocabulary size, then cached: it reads every token)."""
    ll = _llguidance()
    n = tokenizer.n_vocab if n_vocab is None else max(int(n_vocab), tokenizer.n_vocab)
    with _bridges_lock:
        per = _bridges.setdefault(tokenizer, {})
        if n not in per:
            wrapper = _VocabWrapper(tokenizer, n)
            eog = sorted(tokenizer.eog_ids)
            per[n] = ll.LLTokenizer(wrapper, n_vocab=n, eos_token=eog or None)
        return per[n]


# ---- grammars ----

class Grammar:
    """A grammar compiled for llguidance. Build with from_json_schema,
    from_text (GBNF or Lark), from_regex or json_object()."""

    def __init__(self, spec: str, source: str):
        self.spec = spec        # llguidance's grammar definition (JSON text)
        self.source = source    # what it was made from, for messages

    def __repr__(self):
        return f"Grammar({self.source})"

    @classmethod
    def from_json_schema(cls, schema) -> "Grammar":
        """A grammar for JSON values that validate against `schema` (a dict, or JSON text)."""
        ll = _llguidance()
        if isinstance(schema, (str, bytes)):
            schema = jsonlimits.loads(schema, "json_schema", error=GrammarError)
        jsonlimits.check_depth(schema, "the JSON schema", error=GrammarError)
        if not isinstance(schema, dict):
            raise GrammarError(f"a JSON schema must be an object (dict) or true, got {type(schema).__name__}")
        schema = closed_objects(schema)
        try:
            spec = ll.LLMatcher.grammar_from_json_schema(json.dumps(schema), defaults=dict(_JSON_OPTIONS))
        except (ValueError, TypeError) as e:
            raise GrammarError(f"invalid JSON schema: {e}") from None
        return cls._checked(spec, "json_schema")

    @classmethod
    def json_object(cls) -> "Grammar":
        """Any JSON object."""
        return cls.from_json_schema({"type": "object"})

    @classmethod
    def from_text(cls, text: str) -> "Grammar":
        """A grammar written as llama.cpp's GBNF (`root ::= ...`) or as Lark
        (llguidance's syntax, `start: ...`); which one is told from the text."""
        ll = _llguidance()
        if not isinstance(text, str) or not text.strip():
            raise GrammarError("grammar must be a non-empty string (GBNF or Lark)")
        try:
            spec = ll.grammar_from("gbnf", text)
        except ValueError as e:
            raise GrammarError(f"cannot read the grammar: {e}") from None
        return cls._checked(spec, "grammar")

    @classmethod
    def from_lark(cls, text: str, source: str = "Lark grammar") -> "Grammar":
        """A grammar in llguidance's Lark syntax (which can embed JSON schemas: `%json {...}`)."""
        ll = _llguidance()
        if not isinstance(text, str) or not text.strip():
            raise GrammarError("a Lark grammar must be a non-empty string")
        return cls._checked(ll.LLMatcher.grammar_from_lark(text), source)

    @classmethod
    def from_regex(cls, pattern: str) -> "Grammar":
        ll = _llguidance()
        if not isinstance(pattern, str):
            raise GrammarError(f"regex must be a string, got {type(pattern).__name__}")
        return cls._checked(ll.LLMatcher.grammar_from_regex(pattern), "regex")

    @classmethod
    def _checked(cls, spec, source) -> "Grammar":
        ll = _llguidance()
        is_error, messages = ll.LLMatcher.validate_grammar_with_warnings(spec, None)
        if is_error:
            raise GrammarError(f"llguidance rejects the {source}: {messages[0] if messages else 'invalid'}")
        return cls(spec, source)


# Keywords whose values are one schema, a list of schemas, or a map of them.
_ONE = ("items", "additionalItems", "contains", "not", "if", "then", "else", "propertyNames",
        "additionalProperties", "unevaluatedItems")
_LIST = ("anyOf", "oneOf", "prefixItems")
_MAP = ("properties", "$defs", "definitions", "patternProperties", "dependentSchemas")


def closed_objects(schema, _in_all_of=False):
    """A copy of a JSON schema in which every object schema that lists
    `properties` and says nothing of `additionalProperties` gets
    additionalProperties: false, as llama.cpp's json-schema-to-grammar reads
    schemas (JSON Schema itself allows other keys; a model given that freedom
    writes keys of its own instead of the ones asked for). The members of an
    allOf are left open: each would otherwise forbid the others' keys."""
    if isinstance(schema, list):
        return [closed_objects(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {}
    for k, v in schema.items():
        if k in _ONE:
            out[k] = closed_objects(v)
        elif k in _LIST and isinstance(v, list):
            out[k] = [closed_objects(s) for s in v]
        elif k == "allOf" and isinstance(v, list):
            out[k] = [closed_objects(s, _in_all_of=True) for s in v]
        elif k in _MAP and isinstance(v, dict):
            out[k] = {name: closed_objects(s) for name, s in v.items()}
        else:
            out[k] = v
    open_keys = ("additionalProperties", "unevaluatedProperties", "patternProperties")
    if isinstance(out.get("properties"), dict) and not _in_all_of and not any(k in out for k in open_keys) \
            and out.get("type", "object") in ("object", ["object"]):
        out["additionalProperties"] = False
    return out


def grammar_from_args(grammar=None, json_schema=None, response_format=None) -> Grammar | None:
    """The Grammar named by a call's arguments, or None: `grammar` (a Grammar,
    GBNF or Lark text), `json_schema` (dict or JSON text), or OpenAI's
    `response_format` ({"type": "text" | "json_object" | "json_schema", ...};
    llama-cpp-python's {"type": "json_object", "schema": {...}} too).
    More than one is an error."""
    given = [n for n, v in (("grammar", grammar), ("json_schema", json_schema),
                            ("response_format", response_format)) if v is not None]
    if len(given) > 1:
        raise InvalidArgumentError(f"give one of grammar, json_schema and response_format, not {' and '.join(given)}")
    if grammar is not None:
        if isinstance(grammar, Grammar):
            return grammar
        if not isinstance(grammar, str) and isinstance(getattr(grammar, "_grammar", None), str):
            grammar = grammar._grammar  # a llama_cpp.LlamaGrammar's GBNF text
        return Grammar.from_text(grammar)
    if json_schema is not None:
        return Grammar.from_json_schema(json_schema)
    if response_format is None:
        return None
    if not isinstance(response_format, dict) or "type" not in response_format:
        raise InvalidArgumentError(f"response_format must be a dict with a 'type', got {response_format!r}")
    kind = response_format["type"]
    if kind == "text":
        return None
    if kind == "json_object":
        schema = response_format.get("schema")
        return Grammar.json_object() if schema is None else Grammar.from_json_schema(schema)
    if kind == "json_schema":
        spec = response_format.get("json_schema", response_format.get("schema"))
        if not isinstance(spec, dict):
            raise InvalidArgumentError("response_format of type json_schema needs a 'json_schema' object "
                                       "({'name': ..., 'schema': {...}})")
        schema = spec.get("schema", spec)
        return Grammar.from_json_schema(schema)
    raise InvalidArgumentError(f"response_format type must be 'text', 'json_object' or 'json_schema', got {kind!r}")


# ---- one generation's constraint ----

# False computes each mask on the caller's thread after the token is
# consumed, for comparison (bench/structured.py --serial).
OVERLAP_MASK = True

_worker = None
_worker_lock = threading.Lock()


def _mask_worker() -> ThreadPoolExecutor:
    """One thread for every mask computation of the process: a generation
    has at most one mask in flight, and llguidance releases the GIL."""
    global _worker
    with _worker_lock:
        if _worker is None:
            _worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="llminfer-mask")
        return _worker


class Constraint:
    """The state of one generation under a Grammar.

        c = Constraint(grammar, tokenizer, n_vocab)   # starts the first mask
        logits = c.apply(logits)        # waits for the mask; disallowed -> -inf
        c.advance(token)                # consumes it, starts the next mask
        c.done                          # the grammar admits nothing more
    """

    def __init__(self, grammar: Grammar, tokenizer, n_vocab: int):
        ll = _llguidance()
        self.n_vocab = int(n_vocab)
        self._lltok = ll_tokenizer(tokenizer, n_vocab)
        self.matcher = ll.LLMatcher(self._lltok, grammar.spec, log_level=0)
        if self.matcher.is_error():
            raise GrammarError(f"llguidance rejects the {grammar.source}: {self.matcher.get_error()}")
        self.grammar = grammar
        self.eos_id = self._lltok.eos_token
        self._bits = np.zeros((self._lltok.vocab_size + 31) // 32, dtype=np.int32)
        self._allowed = None
        self._future = None
        self._done = False
        self._start()

    def _compute(self) -> np.ndarray:
        bits = self._bits
        self.matcher.unsafe_compute_mask_ptr(bits.ctypes.data, bits.nbytes)
        return np.unpackbits(bits.view(np.uint8), bitorder="little")[:self.n_vocab].view(np.bool_)

    def _start(self):
        if OVERLAP_MASK:
            self._future = _mask_worker().submit(self._compute)
        else:
            self._future = None
            self._allowed = self._compute()

    def allowed(self) -> np.ndarray:
        """bool [n_vocab]: the tokens the grammar allows now (waits for the mask)."""
        if self._future is not None:
            self._allowed = self._future.result()
            self._future = None
            if self.matcher.is_error():
                raise GrammarError(f"the grammar matcher failed: {self.matcher.get_error()}")
        return self._allowed

    def apply(self, logits: np.ndarray) -> np.ndarray:
        """A copy of logits (float32 [n_vocab]) with disallowed tokens at -inf."""
        allowed = self.allowed()
        if not allowed.any():
            raise GrammarError(f"the {self.grammar.source} allows no token here (the matcher is stuck)")
        return np.where(allowed, logits, np.float32(-np.inf)).astype(np.float32, copy=False)

    def advance(self, token: int):
        """Feed the sampled token; starts the mask of the next step."""
        self.allowed()  # never consume while a mask is being computed
        if not self.matcher.consume_token(int(token)):
            raise GrammarError(f"token {int(token)} is not allowed by the {self.grammar.source}: "
                               f"{self.matcher.get_error()}")
        # read before the worker borrows the matcher: it is not shared while a mask is computed
        self._done = self.matcher.is_stopped()
        if not self._done:
            self._start()

    @property
    def done(self) -> bool:
        """Whether the grammar is complete and admits no further token."""
        return self._done

    def close(self):
        if self._future is not None:
            self._future.cancel()
            try:
                self._future.result()
            except Exception:  # noqa: BLE001 - a cancelled or failed mask no one will read
                pass
            self._future = None
