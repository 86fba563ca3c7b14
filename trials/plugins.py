"""Finding declarations: every folder of a built-in package that has a ``spec.py``, then the modules a
user names in an environment variable (comma-separated), each with a ``SPEC`` of one type.

Engines (``trials.engines``, ``$LLM_SWEEPS_ENGINES``) and techniques (``trials.groups``,
``$LLM_SWEEPS_TECHNIQUES``) are found here; a technique's spec names its dashboard section, so the
sections come with them. A failure is one ``ConfigError`` line naming the module.
"""

from __future__ import annotations

import os
import pkgutil

from trials.errors import ConfigError, import_named


def discover(package, env_var: str, kind: str, spec_type: type) -> list[tuple[str, object]]:
    """``(module name, SPEC)`` of each built-in folder of ``package`` with a spec, then of each module
    named in ``$env_var``; ``kind`` names them in errors (``engine``, ``technique``). A built-in folder
    without a spec is no declaration; a module whose ``SPEC`` is no ``spec_type``, or two with one
    name, is a ``ConfigError``."""
    built_in = [f"{package.__name__}.{m.name}.spec" for m in pkgutil.iter_modules(package.__path__) if m.ispkg]
    plugins = [n.strip() for n in os.environ.get(env_var, "").split(",") if n.strip()]
    found = []
    for name in built_in + plugins:
        module = import_named(name, f"${env_var}" if name in plugins else kind, name not in plugins)
        if module is None:
            continue
        spec = getattr(module, "SPEC", None)
        if not isinstance(spec, spec_type):
            raise ConfigError(f"{name} has no SPEC (a {spec_type.__module__}.{spec_type.__qualname__})")
        found.append((name, spec))
    names = [spec.name for _, spec in found]
    clash = sorted({n for n in names if names.count(n) > 1})
    if clash:
        raise ConfigError(f"{kind} {clash[0]!r} is declared twice")
    return found
