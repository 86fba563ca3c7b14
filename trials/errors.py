"""The one exception every layer raises for bad input (the bottom of the import graph), the
wrapper that makes it a command's one error line, and the import of a user's plug-in that fails as
such a line too."""

import functools
import re
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
                from trials.redaction import one_line

                print(f"{prog}: error: {one_line(exc)}", file=sys.stderr)
                return 2
        return run
    return wrap


def argument_type(parse, *extra):
    """An argparse type from a parser that raises ValueError (ConfigError is one) with a one-line
    message: that message becomes argparse's own error line. ``extra``: more arguments for ``parse``."""
    import argparse

    def convert(text: str):
        from trials.redaction import one_line

        try:
            return parse(text, *extra)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(one_line(exc)) from None
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


_MODULE_PATH = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")


def import_named(name: str, where: str, optional: bool = False):
    """The module called ``name`` (a plug-in a user named in ``where``, e.g. an environment variable),
    or one ``ConfigError`` line naming it: a name that is no dotted module path, a module that is not
    there, or one that raises anything while it imports (a plug-in's own bug) -- never a traceback.
    ``optional``: None where the module itself is not there (a built-in folder without a spec)."""
    import importlib

    from trials.redaction import shown

    if not _MODULE_PATH.fullmatch(name):
        raise ConfigError(f"{where}: {shown(name)} is not a dotted module path (e.g. my_package.spec)")
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if optional and exc.name == name:
            return None
        failure = exc
    except Exception as exc:        # noqa: BLE001 - a plug-in may raise anything on import
        failure = exc
    raise ConfigError(f"{where}: cannot import {name!r}: {type(failure).__name__}: {failure}")
