"""The interactive chat behind `llminfer chat` (and `llminfer run` without a
prompt on a terminal): a read-reply loop with streaming replies, the
conversation kept as history (and its tokens kept in the KV cache between
turns), and Ollama's slash commands.

When the conversation no longer fits the context, the oldest turns are
dropped (the system message stays) and the rest is rendered again; a reply
that runs past the end of the context shifts it (LLM's context_shift) rather
than stopping. The user is told once, on stderr.

A thinking model's thinking (<think>...</think>) is shown apart from its
answer: dimmed on a terminal, set off by a blank line elsewhere, or left
out with hide_thinking (write_reply); only the answer goes into the history.
"""

from __future__ import annotations

import sys

from llminfer.errors import LLMInferError
from llminfer.generation.sampling import SamplingParams

HELP = '''commands:
  /set                 list the settings
  /set NAME VALUE      change one: temperature, top_p, top_k, min_p, repeat_penalty, seed,
                       num_predict (or max_tokens), system (Ollama's "/set parameter NAME VALUE" too)
  /image PATH          an image for the next message (needs --mmproj; repeatable)
  /clear               forget the conversation (keeps the system message; also /reset)
  /bye                 leave (also /exit, /quit, Ctrl-D)
  /? or /help          this text
  """                  starts and ends a message of several lines'''

# /set NAME -> (the sampling keyword it sets, its type); "seed none" gives a fresh seed each reply
_SETTINGS = {"temperature": ("temperature", float), "top_p": ("top_p", float), "top_k": ("top_k", int),
             "min_p": ("min_p", float), "repeat_penalty": ("repeat_penalty", float), "seed": ("seed", int)}
_MAX_TOKENS = ("num_predict", "max_tokens")
_MULTILINE = '"""'


DIM, RESET = "\033[2m", "\033[0m"


def write_reply(stream, out, hide_thinking: bool = False, answer: list | None = None) -> str:
    """Write a streamed chat reply (LLM.chat_completion(stream=True)) to out
    as it comes: a thinking model's thinking apart from the answer (dimmed
    when out is a terminal; not at all with hide_thinking), then the answer.
    The answer's pieces are appended to `answer` as they are written (what
    an interrupted reply got to); returns the answer's text."""
    answer = answer if answer is not None else []
    r = getattr(stream, "result", None)
    split = r.reasoning.splitter() if r is not None and r.reasoning is not None and r.reasoning.parse else None
    tty = bool(getattr(out, "isatty", lambda: False)())
    thinking = [False]

    def think(text):
        if text and not hide_thinking:
            if not thinking[0]:
                thinking[0] = True
                out.write(DIM if tty else "")
            out.write(text)

    def say(text):
        if text:
            if thinking[0]:
                thinking[0] = False
                out.write((RESET if tty else "") + "\n\n")
            out.write(text)
            answer.append(text)

    try:
        for piece in stream:
            thought, text = split.feed(piece) if split is not None else ("", piece)
            think(thought)
            say(text)
            out.flush()
        if split is not None:
            thought, text = split.finish()
            think(thought)
            say(text)
    finally:
        if thinking[0] and tty:
            out.write(RESET)
        out.flush()
    return "".join(answer)


def prompt_tokens(llm, messages) -> list:
    """The token ids of `messages` rendered with the model's chat format and
    the assistant's turn opened: what llm.chat() will evaluate."""
    from llminfer.vision.prompt import has_images

    if has_images(messages):  # an image's positions are its rows': only the full render counts them
        return list(llm.chat_prompt(messages))
    fmt = llm.chat_format
    text = fmt.render(messages, add_generation_prompt=True)
    return llm.tokenize(text, add_bos=not fmt.adds_bos, special=True)


def _common_prefix(a, b) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


class _Conversation:
    """The messages of one chat and what fits of them in the context."""

    def __init__(self, llm, system):
        self.llm = llm
        self.system = system
        self.turns = []          # user and assistant messages, oldest first
        self.told = False        # the user has been told that old turns are dropped

    def base(self) -> list:
        return [{"role": "system", "content": self.system}] if self.system else []

    def clear(self):
        self.turns = []
        self.told = False

    def fit(self, room) -> tuple[list, int]:
        """(messages, n_keep) for the next reply: the oldest turns dropped
        until the prompt leaves `room` tokens of the context for the reply
        (the newest user message always stays); n_keep: the prompt tokens a
        context shift must keep (the system message's). Raises
        ContextFullError when the newest message alone does not fit."""
        from llminfer.errors import ContextFullError

        n_ctx = self.llm.n_ctx
        turns = list(self.turns)
        ids = prompt_tokens(self.llm, self.base() + turns)
        while len(ids) + room > n_ctx and len(turns) > 1:
            # a user turn and the reply to it go together
            del turns[:2 if len(turns) > 2 and turns[1]["role"] == "assistant" else 1]
            ids = prompt_tokens(self.llm, self.base() + turns)
        if len(ids) >= n_ctx:
            raise ContextFullError(f"this message takes {len(ids)} tokens with the chat template and the "
                                   f"system message; the context holds {n_ctx} (-c to enlarge it)")
        if len(turns) < len(self.turns):
            self.turns = turns
            if not self.told:
                self.told = True
                print(f"llminfer: the conversation no longer fits the context ({n_ctx} tokens): the oldest "
                      f"turns are dropped from now on (/clear starts afresh)", file=sys.stderr, flush=True)
        n_keep = 1
        if self.system:
            # the tokens the system message renders to, as the full prompt starts with them
            fmt = self.llm.chat_format
            alone = self.llm.tokenize(fmt.render(self.base(), add_generation_prompt=False),
                                      add_bos=not fmt.adds_bos, special=True)
            n_keep = max(1, _common_prefix(alone, ids))
        return self.base() + self.turns, n_keep


def _read_message(input_fn, first):
    """The message that starts with line `first`: a line that starts with
    three double quotes opens a message of several lines, closed by a line
    that ends with them (as in Ollama)."""
    if not first.lstrip().startswith(_MULTILINE):
        return first
    text = first.lstrip()[len(_MULTILINE):]
    lines = []
    while True:
        if text.rstrip().endswith(_MULTILINE):
            lines.append(text.rstrip()[:-len(_MULTILINE)])
            break
        lines.append(text)
        text = input_fn("... ")  # EOFError ends the chat, as at the first prompt
    return "\n".join(lines).strip("\n")


class _Settings:
    """The reply settings that /set changes."""

    def __init__(self, sampling, max_tokens):
        self.sampling = dict(sampling)
        self.max_tokens = max_tokens

    def show(self, conv) -> str:
        rows = [f"  {name:<15} {self.sampling.get(key, getattr(SamplingParams(), key))}"
                for name, (key, _) in _SETTINGS.items()]
        rows.append(f"  {'num_predict':<15} {self.max_tokens}")
        rows.append(f"  {'system':<15} {conv.system!r}" if conv.system else f"  {'system':<15} (none)")
        return "settings (/set NAME VALUE changes one):\n" + "\n".join(rows)

    def set(self, args, conv) -> str:
        """Apply `/set` with args (the words after it); the line to show."""
        if args and args[0] == "parameter":  # Ollama's spelling
            args = args[1:]
        if not args:
            return self.show(conv)
        name, value = args[0].lower(), " ".join(args[1:])
        if name == "system":
            conv.system = value or None
            return f"system message {'set' if value else 'removed'}"
        if not value:
            return f"/set {name} needs a value"
        if name in _MAX_TOKENS:
            try:
                n = int(value)
            except ValueError:
                n = -1
            if n < 0:
                return f"{name} must be a non-negative integer, got {value!r}"
            self.max_tokens = n
            return f"set {name} to {n}"
        if name not in _SETTINGS:
            return (f"unknown setting {name!r}; choose from "
                    f"{', '.join(list(_SETTINGS) + list(_MAX_TOKENS) + ['system'])}")
        key, kind = _SETTINGS[name]
        try:
            v = None if name == "seed" and value.lower() == "none" else kind(value)
            new = dict(self.sampling, **{key: v})
            SamplingParams(**{k: x for k, x in new.items() if x is not None})  # checks the value
        except (ValueError, LLMInferError) as e:
            return f"cannot set {name} to {value!r}: {e}"
        self.sampling = new
        return f"set {name} to {v}"


def _add_image(llm, path, images) -> str:
    """/image PATH: the image read and encoded now (a bad file is said at
    once), its path kept for the next message."""
    if not path:
        return "/image needs a path"
    if getattr(llm, "_vision", None) is None:
        return "this model has no vision tower: start the chat with --mmproj FILE"
    try:
        llm.encode_image(path)
    except LLMInferError as e:
        return f"llminfer: {e}"
    images.append(path)
    return f"(image {path} goes with your next message)"


def repl(llm, system=None, max_tokens=512, sampling=None, input_fn=None, out=None, hide_thinking=False,
         chat_options=None) -> int:
    """Chat until /bye or end of input; returns the exit status. Lines come
    from input_fn (default: input), replies go to `out` (default: sys.stdout),
    both looked up at the call so that later redirections apply; the banner
    and errors go to sys.stderr. A turn that fails (a message too long for
    the context, say) is reported and left out of the history. A thinking
    model's thinking is shown apart, or not with hide_thinking
    (write_reply); chat_options (reasoning_budget, enable_thinking,
    chat_template_kwargs) go to each chat call."""
    out = out if out is not None else sys.stdout
    input_fn = input_fn if input_fn is not None else input
    try:
        import readline  # noqa: F401  (line editing and history for input())
    except ImportError:
        pass
    settings = _Settings(sampling or {}, max_tokens)
    conv = _Conversation(llm, system)
    images = []  # paths for the next message (/image)
    name = llm.model_path.name if hasattr(llm.model_path, "name") else str(llm.model_path)
    print(f"llminfer chat with {name} ({llm.chat_format.name} format). /? for help.",
          file=sys.stderr, flush=True)

    def say(text):
        print(text, file=out, flush=True)

    while True:
        try:
            line = _read_message(input_fn, input_fn("> "))
        except EOFError:
            print(file=out)
            return 0
        except KeyboardInterrupt:
            print(file=out)
            continue
        text = line.strip()
        if not text:
            continue
        if text.startswith("/"):
            cmd, *args = text.split()
            if cmd in ("/bye", "/exit", "/quit"):
                return 0
            if cmd in ("/?", "/help"):
                say(HELP)
            elif cmd in ("/clear", "/reset"):
                conv.clear()
                llm.reset()
                say("(conversation cleared)")
            elif cmd == "/set":
                say(settings.set(args, conv))
            elif cmd == "/image":
                say(_add_image(llm, text[len("/image"):].strip(), images))
            else:
                say(f"unknown command {cmd}; /? lists them")
            continue
        content = [{"type": "image", "image": p} for p in images] + [{"type": "text", "text": line}]
        conv.turns.append({"role": "user", "content": content if images else line})
        images.clear()
        reply = []
        try:
            room = max(1, min(settings.max_tokens, llm.n_ctx // 2))
            messages, n_keep = conv.fit(room)
            from llminfer.vision.prompt import has_images

            # a context holding images is not shifted (the reply ends when it is full)
            stream = llm.chat(messages, max_tokens=settings.max_tokens, stream=True,
                              context_shift=not has_images(messages), n_keep=n_keep, **(chat_options or {}),
                              **settings.sampling)
            write_reply(stream, out, hide_thinking, reply)
        except KeyboardInterrupt:
            out.write(" [interrupted]")
        except LLMInferError as e:
            if reply:
                out.write("\n")
                out.flush()
            print(f"llminfer: error: {e}", file=sys.stderr, flush=True)
            conv.turns.pop()
            continue
        out.write("\n")
        out.flush()
        conv.turns.append({"role": "assistant", "content": "".join(reply)})
