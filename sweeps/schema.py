"""Checks a YAML document against a small schema, and says where it is wrong: ``file:line:column``,
the key's dotted path, and what was expected, in one line.

A schema is built from a few types: ``Int(lo, hi)``, ``Choice(values)``, ``Bool()``, ``Text()``,
``ListOf(item)``, ``Fields({key: type}, required=...)`` and ``AnyOf(type, type)``. ``check`` walks
the parsed document beside PyYAML's node tree (which keeps positions), so an error points at the
value itself. Duplicate keys, which PyYAML would silently resolve to the last, are errors too. A value
is echoed back bounded (``trials.redaction.shown``: an alias expansion is never expanded), and a file
nested too deeply to parse is one line too. Torch free: the sweep driver validates a file before
anything heavy starts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from trials.errors import ConfigError
from trials.redaction import shown


class SchemaError(ConfigError):
    """One line: where, which key, what is wrong."""


def _where(source: str, node: yaml.Node | None) -> str:
    if node is None:
        return source
    return f"{source}:{node.start_mark.line + 1}:{node.start_mark.column + 1}"


def fail_at(source: str, node, path: str, message: str):
    """Raise the one-line ``SchemaError`` for ``path`` at ``node``'s position in ``source``."""
    raise SchemaError(f"{_where(source, node)}: {path or 'the file'}: {message}")


class Type:
    def check(self, value: Any, node, path: str, source: str) -> Any:   # pragma: no cover - abstract
        raise NotImplementedError

    def describe(self) -> str:                                           # pragma: no cover - abstract
        raise NotImplementedError


@dataclass
class Number(Type):
    lo: float
    hi: float
    kinds = (int, float)          # what counts as one (never a bool)
    word = "a number"

    def check(self, value, node, path, source):
        if isinstance(value, bool) or not isinstance(value, self.kinds):
            fail_at(source, node, path, f"{shown(value)} is not {self.word} (expected {self.describe()})")
        if not self.lo <= value <= self.hi:
            fail_at(source, node, path, f"{value} is out of range (expected {self.describe()})")
        return value

    def describe(self):
        return f"{self.word} from {self.lo:g} to {self.hi:g}"


@dataclass
class Int(Number):
    lo: int
    hi: int
    kinds = (int,)
    word = "an integer"

    def describe(self):
        return f"{self.word} from {self.lo} to {self.hi}"


@dataclass
class Choice(Type):
    values: tuple

    def check(self, value, node, path, source):
        if value not in self.values:
            fail_at(source, node, path, f"{shown(value)} is not one of {', '.join(map(str, self.values))}")
        return value

    def describe(self):
        return f"one of {', '.join(map(str, self.values))}"


class Bool(Type):
    def check(self, value, node, path, source):
        if not isinstance(value, bool):
            fail_at(source, node, path, f"{shown(value)} is not true or false")
        return value

    def describe(self):
        return "true or false"


class Text(Type):
    def check(self, value, node, path, source):
        if not isinstance(value, str) or not value.strip():
            fail_at(source, node, path, f"{shown(value)} is not a non-empty string")
        return value

    def describe(self):
        return "a string"


@dataclass
class ListOf(Type):
    item: Type

    def check(self, value, node, path, source):
        if not isinstance(value, list) or not value:
            fail_at(source, node, path, f"expected a non-empty list of {self.item.describe()}, got {shown(value)}")
        items = node.value if isinstance(node, yaml.SequenceNode) else [None] * len(value)
        checked = [self.item.check(v, n or node, f"{path}[{i}]", source)
                   for i, (v, n) in enumerate(zip(value, items))]
        seen = set()
        for i, v in enumerate(checked):
            key = repr(v)
            if key in seen:
                fail_at(source, items[i] or node, f"{path}[{i}]", f"{shown(v)} is listed twice")
            seen.add(key)
        return checked

    def describe(self):
        return f"a list of {self.item.describe()}"


@dataclass
class Fields(Type):
    """A mapping with known keys; ``required`` are the keys that must be there (``all``: every one)."""

    fields: dict[str, Type]
    required: tuple | str = ()
    doc: str = "a mapping"
    extra: dict = field(default_factory=dict)      # free for callers: e.g. a section's meaning

    def check(self, value, node, path, source):
        if not isinstance(value, dict):
            fail_at(source, node, path, f"expected {self.doc} with keys {', '.join(self.fields)}, got {shown(value)}")
        positions: dict[str, tuple] = {}
        if isinstance(node, yaml.MappingNode):
            for key_node, value_node in node.value:
                key = key_node.value
                if key in positions:
                    fail_at(source, key_node, _join(path, key), "this key is given twice")
                positions[key] = (key_node, value_node)
        out = {}
        for key, item in value.items():
            key_node, value_node = positions.get(str(key), (node, node))
            if key not in self.fields:
                fail_at(source, key_node, _join(path, str(key)),
                      f"unknown key; valid here: {', '.join(self.fields)}")
            out[key] = self.fields[key].check(item, value_node, _join(path, key), source)
        required = tuple(self.fields) if self.required == "all" else self.required
        for key in required:
            if key not in value:
                fail_at(source, node, path, f"missing key {key!r}")
        return out

    def describe(self):
        return self.doc


@dataclass
class AnyOf(Type):
    """The first of ``types`` whose Python shape fits the value (str -> Text/Choice, dict -> Fields)."""

    types: tuple

    def check(self, value, node, path, source):
        for kind in self.types:
            if (isinstance(kind, Fields) and isinstance(value, dict)) or \
                    (not isinstance(kind, Fields) and not isinstance(value, dict)):
                return kind.check(value, node, path, source)
        fail_at(source, node, path, f"expected {' or '.join(t.describe() for t in self.types)}, got {shown(value)}")

    def describe(self):
        return " or ".join(t.describe() for t in self.types)


def _join(path: str, key) -> str:
    return f"{path}.{key}" if path else str(key)


def read(path: str | Path) -> tuple[Any, yaml.Node | None, str]:
    """(data, node tree, source name) of a YAML file, or one line saying why it cannot be read."""
    source = str(path)
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        raise SchemaError(f"{source}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise SchemaError(f"{source}: cannot read it: {exc}") from None
    try:
        return yaml.safe_load(text), yaml.compose(text, Loader=yaml.SafeLoader), source
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{source}:{mark.line + 1}:{mark.column + 1}" if mark else source
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise SchemaError(f"{where}: not valid YAML: {problem}") from None
    except RecursionError:
        raise SchemaError(f"{source}: nested too deeply to read (a sweep file is a few levels deep)") from None
    except ValueError as exc:                     # e.g. an integer with more digits than Python converts
        raise SchemaError(f"{source}: not valid YAML: {exc}") from None


def node_at(node: yaml.Node | None, *keys) -> yaml.Node | None:
    """The node under ``keys`` of a mapping node (None where it is not there): for callers' own
    errors, e.g. a cross-field check, to point at a position."""
    for key in keys:
        if not isinstance(node, yaml.MappingNode):
            return None
        node = next((v for k, v in node.value if k.value == key), None)
    return node
