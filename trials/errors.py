"""The one exception every layer raises for bad input (the bottom of the import graph), and the
wrapper that makes it a command's one error line."""

import functools
import sys


class ConfigError(ValueError):
    """A trial config that cannot be run; the message is one line meant for the user."""


def one_line_errors(prog: str):
    """Decorate a command's ``main(argv)``: a ``ConfigError`` raised anywhere in it (its argument
    parser reads the techniques, which a bad ``$LLM_SWEEPS_TECHNIQUES`` breaks) is one line on stderr
    and exit code 2, not a traceback."""
    def wrap(main):
        @functools.wraps(main)
        def run(argv: list[str] | None = None) -> int:
            try:
                return main(argv)
            except ConfigError as exc:
                from trials.redaction import redact

                print(f"{prog}: error: {redact(exc)}", file=sys.stderr)
                return 2
        return run
    return wrap


def argument_type(parse, *extra):
    """An argparse type from a parser that raises ValueError (ConfigError is one) with a one-line
    message: that message becomes argparse's own error line. ``extra``: more arguments for ``parse``."""
    import argparse

    def convert(text: str):
        try:
            return parse(text, *extra)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    return convert


def positive_int(text: str) -> int:
    """An argparse type: an integer >= 1 (a count of workers, CPUs, threads), else argparse's one line."""
    import argparse

    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be >= 1")
    return value
