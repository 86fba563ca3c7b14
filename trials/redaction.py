"""Secrets out of everything the tool prints: a password in a URI's user-info (``http://user:pw@host``)
and secret-looking query parameters (``?token=...``) become ``***``.

Every message a command prints about a store goes through ``redact`` (the one-line errors, the
summary, the dashboard's store line, the report's header), so a tracking URI with credentials is
never printed back, in a message, the page or a results file.
"""

from __future__ import annotations

import re

_USERINFO = re.compile(r"(?P<scheme>\b[a-zA-Z][a-zA-Z0-9+.-]*://)(?P<user>[^/@:\s'\"]*):(?P<secret>[^/@\s'\"]+)@")
_QUERY = re.compile(r"(?P<key>[?&](?:token|access_token|password|passwd|pwd|secret|api_key|apikey|key|sig)=)"
                    r"(?P<secret>[^&#\s'\"]+)", re.IGNORECASE)


def redact(text: object) -> str:
    """``text`` with URI passwords and secret query parameters replaced by ``***``."""
    out = _USERINFO.sub(lambda m: f"{m['scheme']}{m['user']}:***@", str(text))
    return _QUERY.sub(lambda m: f"{m['key']}***", out)
