"""llama-cpp-python's `llama_cpp.llama_grammar.LlamaGrammar`, over llminfer's grammars.

    from llminfer.compat.llama_grammar import LlamaGrammar   # was: from llama_cpp.llama_grammar import ...
    grammar = LlamaGrammar.from_string('root ::= "yes" | "no"')
    grammar = LlamaGrammar.from_json_schema(json.dumps(schema))
    llm("Is it raining? ", grammar=grammar)

A LlamaGrammar is a llminfer.text.structured.Grammar, so it goes wherever a
grammar= is taken (Llama and LLM alike), and it is compiled and checked by
llguidance when it is made: a grammar llguidance rejects raises GrammarError
at once (llama-cpp-python reports it at the first generation). A JSON schema
is compiled by llguidance, not turned into GBNF text as llama-cpp-python does:
`_grammar` is then the schema's JSON; JSON is written compactly (", " and
": "), and objects with properties admit no others unless the schema says
additionalProperties, as in llama.cpp.
"""

from __future__ import annotations

import json
import os

from llminfer.errors import GrammarError
from llminfer.text.structured import Grammar

__all__ = ["LlamaGrammar", "LLAMA_GRAMMAR_DEFAULT_ROOT"]

LLAMA_GRAMMAR_DEFAULT_ROOT = "root"


class LlamaGrammar(Grammar):
    """A grammar made by from_string (GBNF), from_file or from_json_schema.
    `verbose` is accepted and has no effect."""

    _grammar: str = ""  # the text it was made from (GBNF, or the schema's JSON)
    _root: str = LLAMA_GRAMMAR_DEFAULT_ROOT

    @classmethod
    def from_string(cls, grammar: str, verbose: bool = True) -> "LlamaGrammar":
        g = cls.from_text(grammar)
        g._grammar = grammar
        return g

    @classmethod
    def from_file(cls, file, verbose: bool = True) -> "LlamaGrammar":
        try:
            with open(os.fspath(file), encoding="utf-8") as f:
                text = f.read()
        except (OSError, TypeError, UnicodeDecodeError) as e:
            raise GrammarError(f"cannot read the grammar file {file!r}: {e}") from None
        if not text.strip():
            raise GrammarError(f"the grammar file {file!r} is empty")
        return cls.from_string(text, verbose=verbose)

    @classmethod
    def from_json_schema(cls, json_schema, verbose: bool = True) -> "LlamaGrammar":
        """json_schema: JSON text, as llama-cpp-python takes it (a dict is accepted too)."""
        g = super().from_json_schema(json_schema)
        g._grammar = json_schema if isinstance(json_schema, str) else json.dumps(json_schema)
        return g
