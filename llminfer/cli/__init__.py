"""The `llminfer` command (commands: run, chat, serve, bench, info, quantize,
pull, ...), its interactive chat (chat_repl) and its bench (bench)."""

from llminfer.cli.commands import main

__all__ = ["main"]
