"""The battery of strings the tokenizer tests (tests/text/test_tokenizer.py)
and bench/tokenizer_parity.py check against llama.cpp."""

from llminfer.text.tokenizer import SPACE_MARK

# Spaces, tabs and newlines, digits, accents, CJK, emoji, chat markup of both
# model families, empty text.
BATTERY = [
    "Hello world",
    "The quick brown fox jumps over the lazy dog.",
    "",
    " ",
    "   ",
    " leading space",
    "  two leading spaces",
    "trailing space ",
    "trailing spaces   ",
    "repeated    inner     spaces",
    "tab\there\t\tand\ttabs",
    "line one\nline two\n\nline four\n",
    "windows\r\nline endings\r\n",
    "mixed \t\n whitespace \n\t ",
    "1 12 123 1234 12345 123456789012345678901234567890",
    "3.14159 -42 1,000,000 0x1F 2024-01-31",
    "café naïve résumé Ångström façade",
    "e\u0301 combining accent, decomposed",
    "日本語のテキストと中文字符和한국어",
    "👋 Hello 🌍! 🎉🎉 👨‍👩‍👧‍👦 🏳️‍🌈",
    "I'm sure they'll say we've done it, 'quoted' text",
    "CamelCase snake_case kebab-case SCREAMING_CASE",
    "def f(x):\n    return x ** 2  # code\n",
    "<html><body>tags &amp; entities</body></html>",
    "<|im_start|>user\nHi there!<|im_end|>\n<|im_start|>assistant\n",
    "<start_of_turn>user\nHi there!<end_of_turn>\n<start_of_turn>model\n",
    "<bos><eos></s><s><unk><pad><|endoftext|>",
    "\u00a0non-breaking\u3000ideographic space",
    "Ünïcödé ÀÉÎÕÜ ßẞ ﬁ ligature ①②③ ½",
    "Ελληνικά Русский עברית العربية हिन्दी",
    "a" * 100 + " " + "ab" * 50,
    "\x00 nul and \x7f del \x1b escape",
    f"{SPACE_MARK}already escaped{SPACE_MARK} space marks",
    "\U0001f600\U0001f601 \U00010348 \U0001d11e rare planes",
    "ÀbcÉ ßẞ Xyz's McDonald'S\n\n  \tend 12,345.678 \u0661\u0662\u0663\u0664 1234567",
    "x\u3000\u3000y \u2003z\u00a0\n \u0085!\u3000\u3001\u1680",
]

# (add_bos, special) combinations every battery string is checked under
FLAGS = [(True, False), (True, True), (False, False), (False, True)]
