"""Tool calling: OpenAI's `tools` / `tool_choice` over the chat formats of the
model families we load.

    out = llm.create_chat_completion(messages, tools=[{"type": "function", "function": {
        "name": "get_weather", "parameters": {"type": "object", "properties": {...}}}}],
        tool_choice="auto")       # "none", "required", {"type": "function", "function": {"name": ...}}
    out["choices"][0]["message"]["tool_calls"]   # [{"id", "type": "function", "function": {"name", "arguments"}}]

The chat template renders the tools (templates receive `tools`); a template
that does not know tools gets them as a Hermes-style system prompt. The text
the model writes is parsed into tool calls by its family's format:

  hermes   Qwen 2.5/3, Hermes, SmolLM: <tool_call>{"name": ..., "arguments": {...}}</tool_call>
  llama3   Llama 3.x: [<|python_tag|>]{"name": ..., "parameters": {...}} (also "arguments")
  mistral  [TOOL_CALLS][{"name": ..., "arguments": {...}}, ...], or [TOOL_CALLS]name[ARGS]{...}
  gemma    ```tool_code\\nname(a=1, b="x")\\n``` or [name(a=1), ...] (Python calls), or JSON inside
  phi      Phi-4-mini: functools[{"name": ..., "arguments": {...}}, ...] (also in <|tool_call|>)

When a call is required (tool_choice "required" or a named function), the
generation is constrained by a grammar (llminfer.text.structured) that writes the
family's syntax with the arguments matching each tool's JSON schema, so the
call always parses and validates.

The chat completion itself (the OpenAI objects, the call ids) is built by
llminfer.generation.completions and llminfer.generation.openai_shapes, the server's by
llminfer.server.app, both over what this module parses.
"""

from __future__ import annotations

import ast
import json
import re

from llminfer.text import harmony, jsonlimits
from llminfer.errors import InvalidArgumentError
from llminfer.text.structured import Grammar

__all__ = ["FORMATS", "detect_format", "parse_tool_calls", "check_tools", "prepare_messages", "tool_prompt",
           "ToolCallStream"]

FORMATS = ("hermes", "llama3", "mistral", "gemma", "phi", "harmony")

_HERMES_SYSTEM = (
    "You are a function calling AI model. You are provided with function signatures within <tools></tools> "
    "XML tags. You may call one or more functions to assist with the user query. Don't make assumptions "
    "about what values to plug into functions. Here are the available tools: <tools>\n{tools}\n</tools>\n"
    "For each function call return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags as follows:\n<tool_call>\n"
    '{{"name": <function-name>, "arguments": <args-dict>}}\n</tool_call>')


# ---- arguments ----

def check_tools(tools, tool_choice):
    """(tools as a list of function dicts {"name", "description", "parameters"},
    tool_choice as "none" | "auto" | "required" | a function name)."""
    if tools is None:
        tools = []
    if not isinstance(tools, (list, tuple)):
        raise InvalidArgumentError(f"tools must be a list of {{'type': 'function', 'function': {{...}}}}, "
                                   f"got {type(tools).__name__}")
    funcs = []
    for i, t in enumerate(tools):
        if not isinstance(t, dict) or t.get("type", "function") != "function" or not isinstance(
                t.get("function"), dict):
            raise InvalidArgumentError(f"tools[{i}] must be {{'type': 'function', 'function': {{'name': ..., "
                                       f"'parameters': {{...}}}}}}, got {str(t)[:80]}")
        f = t["function"]
        if not isinstance(f.get("name"), str) or not f["name"]:
            raise InvalidArgumentError(f"tools[{i}].function needs a 'name' string")
        params = f.get("parameters", {"type": "object", "properties": {}})
        if not isinstance(params, dict):
            raise InvalidArgumentError(f"tools[{i}].function.parameters must be a JSON schema object")
        jsonlimits.check_depth(params, f"tools[{i}].function.parameters")
        funcs.append({"name": f["name"], "description": f.get("description", ""), "parameters": params})
    names = [f["name"] for f in funcs]
    if len(set(names)) != len(names):
        raise InvalidArgumentError(f"tool names must be distinct, got {names}")
    if tool_choice is None:
        choice = "auto" if funcs else "none"
    elif tool_choice in ("none", "auto", "required"):
        choice = tool_choice
    elif isinstance(tool_choice, dict) and isinstance(tool_choice.get("function"), dict):
        choice = tool_choice["function"].get("name")
        if choice not in names:
            raise InvalidArgumentError(f"tool_choice names function {choice!r}, which is not in tools ({names})")
    else:
        raise InvalidArgumentError(f"tool_choice must be 'none', 'auto', 'required' or "
                                   f"{{'type': 'function', 'function': {{'name': ...}}}}, got {tool_choice!r}")
    if choice in ("auto", "required") and not funcs and tool_choice is not None:
        raise InvalidArgumentError(f"tool_choice={choice!r} needs tools")
    return funcs, choice


# ---- families ----

def detect_format(template: str, metadata: dict) -> str:
    """The tool-call format of a model, from its chat template and vocabulary."""
    tokens = metadata.get("tokenizer.ggml.tokens") or ()
    vocab = set(tokens[:200]) | set(tokens[-2000:]) if tokens else set()
    arch = str(metadata.get("general.architecture", ""))
    name = str(metadata.get("general.name", "")).lower()
    if harmony.is_harmony(template):  # gpt-oss: calls are commentary messages to functions.NAME
        return "harmony"
    if "<tool_call>" in template:
        return "hermes"
    if "[TOOL_CALLS]" in template or "[TOOL_CALLS]" in vocab:
        return "mistral"
    if "functools" in template or "<|tool_call|>" in template or "phi" in arch or "phi" in name:
        return "phi"
    if "<|python_tag|>" in template or "<|eom_id|>" in template or "<|python_tag|>" in vocab:
        return "llama3"
    if arch.startswith("gemma") or "tool_code" in template:
        return "gemma"
    return "hermes"


def _template_knows_tools(template: str) -> bool:
    return "tools" in template


def prepare_messages(messages, knows_tools: bool, fmt: str = "hermes"):
    """Messages a template can render: content None -> "", content parts
    joined, tool_calls' JSON-string arguments as dicts (as Hugging Face
    templates expect). For a template that knows no tools, assistant tool
    calls become text in the family's format and tool results become user
    turns in <tool_response> tags."""
    if not isinstance(messages, (list, tuple)):
        return messages
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            out.append(m)
            continue
        m = dict(m)
        content = m.get("content")
        if content is None and ("content" in m or m.get("tool_calls") or m.get("role") == "tool"):
            content = ""
        elif isinstance(content, list):
            content = "".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
        if content is not None:
            m["content"] = content
        calls = m.get("tool_calls")
        if calls:
            fixed = []
            for c in calls:
                c = dict(c)
                f = dict(c.get("function", {}))
                what = f"messages[{i}].tool_calls' arguments"
                if isinstance(f.get("arguments"), str):  # text that is not JSON is rendered as it is
                    f["arguments"] = jsonlimits.loads(f["arguments"], what, default=f["arguments"])
                jsonlimits.check_depth(f.get("arguments"), what)
                c["function"] = f
                fixed.append(c)
            m["tool_calls"] = fixed
            if not knows_tools:
                m["content"] = (content or "") + "".join(
                    _render_call(fmt, c["function"].get("name", ""), c["function"].get("arguments", {}))
                    for c in fixed)
                del m["tool_calls"]
        if m.get("role") == "tool" and not knows_tools:
            m = {"role": "user", "content": f"<tool_response>\n{m.get('content', '')}\n</tool_response>"}
        out.append(m)
    return out


def _render_call(fmt, name, args) -> str:
    body = json.dumps({"name": name, "arguments": args}, ensure_ascii=False)
    if fmt == "llama3":
        return json.dumps({"name": name, "parameters": args}, ensure_ascii=False)
    if fmt == "mistral":
        return f"[TOOL_CALLS][{body}]"
    if fmt == "phi":
        return f"functools[{body}]"
    if fmt == "gemma":
        return f"```tool_code\n{json.dumps({'name': name, 'parameters': args}, ensure_ascii=False)}\n```"
    return f"<tool_call>\n{body}\n</tool_call>"


# ---- parsing ----

def _json_at(text, i):
    """(value, end) of the JSON value starting at text[i] (after blanks), or (None, i)."""
    while i < len(text) and text[i] in " \t\r\n":
        i += 1
    try:
        return jsonlimits.raw_decode(text, i)
    except ValueError:  # not JSON, or nested too deep to be a call: plain text
        return None, i


def _call(obj):
    """{"name", "arguments": dict} of a parsed call object, or None."""
    if not isinstance(obj, dict):
        return None
    if isinstance(obj.get("function"), dict):  # {"type": "function", "function": {...}}
        obj = obj["function"]
    name = obj.get("name")
    if not isinstance(name, str):
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):
        try:
            args = jsonlimits.loads(args, "arguments", default=None)
        except InvalidArgumentError:  # nested too deep to be a call's arguments
            return None
    if not isinstance(args, dict):
        return None
    return {"name": name, "arguments": args}


def _calls(value) -> list:
    items = value if isinstance(value, list) else [value]
    calls = [_call(v) for v in items]
    return calls if calls and all(c is not None for c in calls) else []


def _parse_hermes(text):
    calls, spans = [], []
    for m in re.finditer(r"<tool_call>", text):
        value, end = _json_at(text, m.end())
        found = _calls(value)
        if not found:
            continue
        rest = re.match(r"\s*</tool_call>", text[end:])
        end += rest.end() if rest else 0
        calls += found
        spans.append((m.start(), end))
    return calls, spans


def _parse_mistral(text):
    calls, spans = [], []
    for m in re.finditer(r"\[TOOL_CALLS\]", text):
        value, end = _json_at(text, m.end())
        found = _calls(value)
        if not found:  # newer form: [TOOL_CALLS]name[ARGS]{...}
            nm = re.match(r"\s*([A-Za-z_][\w.\-]*)\s*(?:\[CALL_ID\][\w]*)?\s*\[ARGS\]", text[m.end():])
            if nm:
                args, end = _json_at(text, m.end() + nm.end())
                if isinstance(args, dict):
                    found = [{"name": nm.group(1), "arguments": args}]
        if found:
            calls += found
            spans.append((m.start(), end))
    return calls, spans


def _parse_phi(text):
    calls, spans = [], []
    for m in re.finditer(r"functools\s*(?=\[)", text):
        value, end = _json_at(text, m.end())
        found = _calls(value)
        if found:
            calls += found
            spans.append((m.start(), end))
    for m in re.finditer(r"<\|tool_call\|>", text):
        value, end = _json_at(text, m.end())
        found = _calls(value)
        if found:
            rest = re.match(r"\s*<\|/tool_call\|>", text[end:])
            calls += found
            spans.append((m.start(), end + (rest.end() if rest else 0)))
    return calls, spans


def _parse_llama3(text):
    start = text.find("<|python_tag|>")
    i = start + len("<|python_tag|>") if start >= 0 else 0
    calls, spans, first = [], [], (start if start >= 0 else None)
    # one JSON call, or several separated by ";" (Llama 3.2's custom tools)
    while True:
        value, end = _json_at(text, i)
        found = _calls(value) if isinstance(value, dict) else []
        if not found:
            break
        if first is None:
            first = i
        calls += found
        i = end
        sep = re.match(r"\s*;", text[i:])
        if not sep:
            break
        i += sep.end()
    if calls and (start >= 0 or not text[i:].strip()):  # bare JSON must be the whole reply
        spans.append((first, i))
        return calls, spans
    return [], []


def _python_calls(src):
    """[{"name", "arguments"}] of Python call expressions name(k=v, ...), or a list of them."""
    try:
        tree = ast.parse(src.strip(), mode="eval").body
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return []
    nodes = tree.elts if isinstance(tree, ast.List) else [tree]
    out = []
    for node in nodes:
        if not isinstance(node, ast.Call) or node.args:
            return []
        func = node.func
        parts = []
        while isinstance(func, ast.Attribute):
            parts.append(func.attr)
            func = func.value
        if not isinstance(func, ast.Name):
            return []
        parts.append(func.id)
        try:
            args = {k.arg: ast.literal_eval(k.value) for k in node.keywords if k.arg}
        except (ValueError, SyntaxError, RecursionError, MemoryError):
            return []
        if jsonlimits.too_deep(args):
            return []
        out.append({"name": ".".join(reversed(parts)), "arguments": args})
    return out


def _parse_gemma(text):
    calls, spans = [], []
    for m in re.finditer(r"```(?:tool_code|tool_call|python|json)?\s*\n(.*?)```", text, re.S):
        body = m.group(1)
        value, end = _json_at(body, 0)
        found = _calls(value) if value is not None and not body[end:].strip() else _python_calls(body)
        if found:
            calls += found
            spans.append((m.start(), m.end()))
    if not calls:
        stripped = text.strip()
        if stripped.startswith("[") and stripped.endswith("]"):
            found = _python_calls(stripped)
            if found:
                calls, spans = found, [(text.find("["), text.rfind("]") + 1)]
    return calls, spans


_HARMONY_CALL = re.compile(r"(?:<\|start\|>assistant)?[^<]*?(?:<\|channel\|>commentary)?[ \t]*to=functions\.([^\s<]+)"
                           r"[^<]*(?:<\|channel\|>commentary[^<]*)?(?:<\|constrain\|>[^<]*)?<\|message\|>")


def _parse_harmony(text):
    """gpt-oss's calls: a commentary message to functions.NAME whose body
    (up to <|call|>, <|end|> or the end) is the arguments' JSON."""
    calls, spans = [], []
    for m in _HARMONY_CALL.finditer(text):
        end = min((i for i in (text.find(t, m.end()) for t in (harmony.CALL, harmony.END)) if i >= 0),
                  default=len(text))
        call = _call({"name": m.group(1), "arguments": text[m.end():end].strip() or "{}"})
        if call is not None:
            calls.append(call)
            stop = end + len(harmony.CALL) if text.startswith(harmony.CALL, end) else end
            spans.append((m.start(), stop))
    return calls, spans


_PARSERS = {"hermes": _parse_hermes, "mistral": _parse_mistral, "phi": _parse_phi,
            "llama3": _parse_llama3, "gemma": _parse_gemma, "harmony": _parse_harmony}


def parse_tool_calls(text: str, fmt: str = "hermes"):
    """(content, calls) of a model's reply: calls as [{"name", "arguments":
    dict}], content the text outside them (None when only blanks). The
    family's format is tried first, then the others."""
    if fmt not in _PARSERS:
        raise InvalidArgumentError(f"unknown tool-call format {fmt!r}; known: {', '.join(FORMATS)}")
    for name in (fmt,) + tuple(f for f in FORMATS if f != fmt):
        calls, spans = _PARSERS[name](text)
        if calls:
            content, at = [], 0
            for a, b in spans:
                content.append(text[at:a])
                at = b
            content.append(text[at:])
            rest = "".join(content).replace("<|python_tag|>", "").strip()
            return (rest or None), calls
    return (text if text.strip() else None), []


# ---- constrained calls ----

def _lark_literal(tokenizer, text):
    """A Lark terminal for a marker: the token itself when it is one control
    token (its bytes are not text), else the string."""
    tid = tokenizer.token_id(text)
    if tid is not None and tokenizer.is_control(tid):
        return f"<[{tid}]>"
    return json.dumps(text)


def call_grammar(fmt, funcs, tokenizer) -> Grammar:
    """A grammar for exactly one call to one of funcs, in the family's syntax,
    its arguments valid against the function's parameters schema."""
    args_key = "parameters" if fmt in ("llama3", "gemma") else "arguments"
    options = []
    for f in funcs:
        options.append({"type": "object", "additionalProperties": False, "required": ["name", args_key],
                        "properties": {"name": {"const": f["name"]}, args_key: f["parameters"]}})
    schema = options[0] if len(options) == 1 else {"anyOf": options}
    schema = dict(schema, **{"x-guidance": {"whitespace_flexible": False, "item_separator": ", ",
                                             "key_separator": ": "}})
    call = f"%json {json.dumps(schema)}"
    lit = lambda s: _lark_literal(tokenizer, s)  # noqa: E731
    if fmt == "hermes":
        body = f'{lit("<tool_call>")} "\\n" call "\\n" {lit("</tool_call>")}'
    elif fmt == "mistral":
        body = f'{lit("[TOOL_CALLS]")} "[" call "]"'
    elif fmt == "phi":
        body = '"functools[" call "]"'
    elif fmt == "gemma":
        body = '"```tool_code\\n" call "\\n```"'
    else:
        body = "call"
    return Grammar.from_lark(f"start: {body}\ncall: {call}\n", "tool-call grammar")


# ---- the prompt, and the streamed reply ----

def tool_prompt(fmt_obj, metadata, tokenizer, messages, funcs, choice, template_kwargs=None):
    """A chat with tools as its model reads it: (prompt text, the functions
    offered, the format to parse the reply in, the call grammar or None).
    funcs and choice: what check_tools gave. The grammar is set when a call
    is required ("required" or a named function). template_kwargs: more
    variables for the template (enable_thinking, say)."""
    template = fmt_obj.template
    fam = detect_format(template, metadata)
    knows = _template_knows_tools(template)
    msgs = prepare_messages(messages, knows, fam)
    offered = funcs if choice in ("auto", "required") else [f for f in funcs if f["name"] == choice]
    if choice == "none":
        offered = []
    extra = dict(template_kwargs or {})
    if offered:
        listed = [{"type": "function", "function": f} for f in offered]
        if knows:
            extra["tools"] = listed
        else:
            system = _HERMES_SYSTEM.format(tools="\n".join(json.dumps(t, ensure_ascii=False) for t in listed))
            if msgs and isinstance(msgs[0], dict) and msgs[0].get("role") == "system":
                msgs = [dict(msgs[0], content=msgs[0]["content"] + "\n\n" + system)] + list(msgs[1:])
            else:
                msgs = [{"role": "system", "content": system}] + list(msgs)
    text = fmt_obj.render(msgs, add_generation_prompt=True, **extra)
    parse_fmt = fam if knows else "hermes"
    # harmony writes a header before a call, which the model chooses: no grammar
    required = choice not in ("none", "auto") and parse_fmt != "harmony"
    grammar = call_grammar(parse_fmt, offered, tokenizer) if required else None
    return text, offered, parse_fmt, grammar


_MARKERS = ("<tool_call>", "[TOOL_CALLS]", "functools[", "<|tool_call|>", "<|python_tag|>", "```")


class ToolCallStream:
    """A streamed reply split into the content to send now and the tool calls
    at its end: text goes out as it comes until a tool-call marker might
    begin (or, for bare-JSON formats, a reply opens with "{" or "["); from
    there on it is held back, and finish() parses the whole reply.

        s = ToolCallStream(fmt)
        for piece in pieces: send(s.feed(piece))        # "" while held back
        rest, calls = s.finish(full_text)                # rest: the held text, when no call parses
    """

    def __init__(self, fmt: str):
        self.fmt = fmt
        self.sent, self.held = "", ""
        self.holding = False

    def feed(self, piece: str) -> str:
        self.held += piece
        if self.holding:
            return ""
        if not (self.sent + self.held).strip():
            return ""
        lead = (self.sent + self.held).lstrip()
        if lead[:1] in "{[" and not self.sent.strip():
            self.holding = True
            return ""
        cut = _marker_start(self.held)
        if cut is None:
            out, self.held = self.held, ""
        elif cut > 0:
            out, self.held = self.held[:cut], self.held[cut:]
            self.holding = any(self.held.startswith(m) for m in _MARKERS) or self.holding
        else:
            out = ""
            self.holding = any(self.held.startswith(m) for m in _MARKERS)
        self.sent += out
        return out

    def finish(self, full: str):
        """(content still to send, calls): full is the whole reply with its
        special tokens written out."""
        content, calls = parse_tool_calls(full, self.fmt)
        return ("" if calls else self.held), calls


def _marker_start(text):
    """Where in text a tool-call marker begins or might begin (a prefix of one
    at its end), or None."""
    best = None
    for m in _MARKERS:
        i = text.find(m)
        if i >= 0:
            best = i if best is None else min(best, i)
    if best is not None:
        return best
    for m in _MARKERS:
        for n in range(min(len(m) - 1, len(text)), 0, -1):
            if text.endswith(m[:n]):
                i = len(text) - n
                best = i if best is None else min(best, i)
                break
    return best

