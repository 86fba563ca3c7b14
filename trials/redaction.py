"""What the tool prints of what it was given: no secret, and no value longer than a line.

Secrets: user-info in a URI (``http://user:pw@host`` shows ``user:***@``; a token alone,
``https://TOKEN@host``, shows ``***@``) and query or fragment parameters named like tokens, keys,
signatures or passwords (``?token=...``, ``&X-Amz-Signature=...``, ``#access_token=...``) become
``***``. Every message a command prints about a store goes through ``redact`` (the one-line errors,
the summary, the dashboard's store line, the report's header), so a tracking URI with credentials
is never printed back, in a message, the page or a results file.

Length: a user's value is echoed back in an error (a model name, a path, a YAML value), and a 10 MB
value or a YAML alias expansion would be a line of megabytes. ``shown`` is a bounded ``repr`` (long
strings, long lists and deep nesting cut with ``...``, built without expanding them), and
``one_line`` is the line a command prints for an error: redacted first (a cut must not separate a
secret from the URI that marks it), on one line, every run without spaces longer than ``MAX_VALUE``
characters cut with an ellipsis, and the whole at most ``MAX_LINE``.
"""

from __future__ import annotations

import re
import reprlib

MAX_VALUE = 200          # characters of one echoed value
MAX_LINE = 2000          # characters of one printed message

_SCHEME = r"(?P<scheme>\b[a-zA-Z][a-zA-Z0-9+.-]{0,31}://)"      # bounded: linear on any input
_USER_PASSWORD = re.compile(_SCHEME + r"(?P<user>[^/@:\s'\"]*):(?P<secret>[^/\s'\"]+)@")
_USER_ONLY = re.compile(_SCHEME + r"(?P<user>[^/:\s'\"]+)@")
_SECRET_NAME = r"[\w.-]*?(?:token|key|secret|passw|pwd|sig|auth|credential|session|cookie)[\w.-]*"
_QUERY = re.compile(rf"(?P<key>[?&;#]{_SECRET_NAME}=)(?P<secret>[^&#;\s'\"]+)", re.IGNORECASE)
_LONG_RUN = re.compile(rf"\S{{{MAX_VALUE + 1},}}")

_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxstring, _REPR.maxother, _REPR.maxlong = 3, MAX_VALUE, MAX_VALUE, 60
_REPR.maxlist = _REPR.maxtuple = _REPR.maxdict = _REPR.maxset = _REPR.maxfrozenset = _REPR.maxdeque = 8


def redact(text: object) -> str:
    """``text`` with URI user-info (passwords; a user name alone, which may be a token) and secret
    query parameters replaced by ``***``."""
    out = str(text)
    if "://" in out:
        out = _USER_PASSWORD.sub(lambda m: f"{m['scheme']}{m['user']}:***@", out)
        out = _USER_ONLY.sub(lambda m: f"{m['scheme']}***@", out)
    return _QUERY.sub(lambda m: f"{m['key']}***", out)


def shorten(text: str, limit: int = MAX_VALUE) -> str:
    """``text``, or its first ``limit`` characters and an ellipsis."""
    return text if len(text) <= limit else text[:limit] + "…"


def shown(value: object) -> str:
    """A user's value as an error echoes it: ``repr`` bounded in length, list length and depth (a
    YAML alias expansion or a value nested thousands deep is never expanded), secrets redacted."""
    return shorten(redact(_REPR.repr(value)))


def one_line(text: object) -> str:
    """The line a command prints for an error: redacted, its lines joined, every run of more than
    ``MAX_VALUE`` characters without a space shortened, and at most ``MAX_LINE`` characters."""
    out = " ".join(part.strip() for part in redact(text).splitlines() if part.strip())
    return shorten(_LONG_RUN.sub(lambda m: shorten(m[0]), out), MAX_LINE)
