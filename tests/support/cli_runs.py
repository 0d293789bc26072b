"""The command line run in-process, as the CLI tests run it."""

from llminfer.cli import commands as cli


def run_main(capsys, *argv):
    """(exit status, stdout, stderr) of `llminfer ARGV` run in-process."""
    code = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


class Script:
    """input() for repl(): hands out the lines, then raises EOFError."""

    def __init__(self, *lines):
        self.lines = list(lines)
        self.prompts = 0

    def __call__(self, prompt):
        assert prompt in ("> ", "... ")  # "... ": the lines of a """ message
        self.prompts += 1
        if not self.lines:
            raise EOFError
        return self.lines.pop(0)
