"""The interactive chat behind `llminfer chat`: a read-reply loop in the
terminal with streaming replies, the conversation kept as history (and its
tokens kept in the KV cache between turns), and a few slash commands."""

from __future__ import annotations

import sys

from llminfer.errors import ContextFullError, LLMInferError

HELP = """commands:
  /reset   forget the conversation (keeps the system message)
  /exit    leave (also Ctrl-D)
  /help    this text"""


def repl(llm, system=None, max_tokens=512, sampling=None, input_fn=None, out=None) -> int:
    """Chat until /exit or end of input; returns the exit status. Lines come
    from input_fn (default: input), replies go to `out` (default: sys.stdout),
    both looked up at the call so that later redirections apply; the banner
    and errors go to sys.stderr. A turn that fails (the conversation no longer
    fits the context, say) is reported and left out of the history."""
    out = out if out is not None else sys.stdout
    input_fn = input_fn if input_fn is not None else input
    try:
        import readline  # noqa: F401  (line editing and history for input())
    except ImportError:
        pass
    sampling = sampling or {}
    base = [{"role": "system", "content": system}] if system else []
    history = list(base)
    name = llm.model_path.name if hasattr(llm.model_path, "name") else str(llm.model_path)
    print(f"llminfer chat with {name} ({llm.chat_format.name} format). /help for commands.",
          file=sys.stderr, flush=True)
    while True:
        try:
            line = input_fn("> ")
        except EOFError:
            print(file=out)
            return 0
        except KeyboardInterrupt:
            print(file=out)
            continue
        text = line.strip()
        if not text:
            continue
        if text in ("/exit", "/quit"):
            return 0
        if text == "/help":
            print(HELP, file=out, flush=True)
            continue
        if text == "/reset":
            history = list(base)
            llm.reset()
            print("(conversation cleared)", file=out, flush=True)
            continue
        if text.startswith("/"):
            print(f"unknown command {text.split()[0]}; /help lists them", file=out, flush=True)
            continue
        history.append({"role": "user", "content": line})
        reply = []
        try:
            for piece in llm.chat(history, max_tokens=max_tokens, stream=True, **sampling):
                reply.append(piece)
                out.write(piece)
                out.flush()
        except KeyboardInterrupt:
            out.write(" [interrupted]")
        except LLMInferError as e:
            if reply:
                out.write("\n")
                out.flush()
            hint = " (/reset starts a new conversation)" if isinstance(e, ContextFullError) else ""
            print(f"llminfer: error: {e}{hint}", file=sys.stderr, flush=True)
            history.pop()
            continue
        out.write("\n")
        out.flush()
        history.append({"role": "assistant", "content": "".join(reply)})
