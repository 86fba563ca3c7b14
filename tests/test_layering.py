"""The code's layering: no import cycle, torch-free modules stay torch-free, every pointer resolves.

The import graph is read from the source (``ast``), function-local imports included, so a cycle
hidden inside a function body fails here as surely as one at module level. The whole graph must be
acyclic; importing every module in a fresh interpreter, in dependency order (leaves first), then
proves each imports on its own.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("trials", "sweeps", "tracking", "dashboard")
# Modules a process without torch imports (the dashboard, the sweep's planning): they and everything
# they import must not import torch, transformers or the measurement loop.
TORCH_FREE = ("trials.groups", "trials.stats.theory", "trials.stats.factorial", "trials.config",
              "trials.models", "trials.models.registry", "trials.measurement.kv_footprint", "trials.errors",
              "trials.engines.transformers.arguments", "trials.stats.serving", "trials.stats.step_time",
              "trials.measurement.load", "trials.stats.capacity",
              "trials.techniques.serving.spec", "dashboard.sections.serving", "dashboard.sections.capacity",
              "trials.engines.server_process", "trials.engines.transformers_serve.spec",
              "dashboard.app", "tracking.store", "sweeps.capacity_search")


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def project_modules() -> dict[str, Path]:
    return {module_name(p): p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")}


def imports_of(path: Path, modules: dict[str, Path]) -> dict[str, list[tuple[str, int, bool]]]:
    """Project modules imported by ``path``: name -> [(imported, line, inside a function)]."""
    tree = ast.parse(path.read_text(), str(path))
    found: list[tuple[str, int, bool]] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            local = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
            if isinstance(child, ast.Import):
                found.extend((a.name, child.lineno, in_function) for a in child.names)
            elif isinstance(child, ast.ImportFrom) and child.module and child.level == 0:
                for alias in child.names:
                    sub = f"{child.module}.{alias.name}"
                    found.append((sub if sub in modules else child.module, child.lineno, in_function))
            visit(child, local)

    visit(tree, False)
    return [(name, line, local) for name, line, local in found if name in modules]


def import_graph() -> dict[str, set[str]]:
    modules = project_modules()
    return {name: {imported for imported, _, _ in imports_of(path, modules) if imported != name}
            for name, path in modules.items()}


def test_the_import_graph_has_no_cycle():
    graph = import_graph()
    try:
        order = list(TopologicalSorter(graph).static_order())
    except CycleError as exc:
        pytest.fail(f"import cycle: {' -> '.join(exc.args[1])}")
    assert set(order) == set(graph)


def test_every_module_imports_on_its_own_in_dependency_order():
    """A fresh interpreter imports every module, leaves first: none needs another to be imported before it."""
    order = [m for m in TopologicalSorter(import_graph()).static_order()
             if m not in ("sweeps.full", "dashboard.app")]          # scripts: they parse argv on import
    code = "import importlib, sys\nfor m in sys.argv[1:]:\n    importlib.import_module(m)\n"
    out = subprocess.run([sys.executable, "-c", code, *order], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]


def test_the_loop_and_lower_modules_import_no_technique():
    """Techniques import the loop; nothing below the techniques imports one."""
    graph = import_graph()
    techniques = {pointer.split(":")[0] for g in __import__("trials.groups").groups.GROUPS
                  for pointer in (g.runner,) if pointer}
    below = ("trials.loop", "trials.models.loading", "trials.measurement.instruments", "trials.config",
             "trials.models.registry", "trials.models.quantized_weights", "trials.measurement.perplexity",
             "trials.worker", "trials.models.zoo")

    def reach(module: str, seen: set[str]) -> set[str]:
        for dep in graph.get(module, ()):
            if dep not in seen:
                seen.add(dep)
                reach(dep, seen)
        return seen

    for module in below:
        assert not reach(module, set()) & techniques, f"{module} reaches a technique"


@pytest.mark.parametrize("module", TORCH_FREE)
def test_torch_free_modules_stay_torch_free(module):
    code = (f"import sys, {module}\n"
            "heavy = sorted(m for m in ('torch', 'transformers', 'trials.loop', 'trials.models.loading') if m in sys.modules)\n"
            "print(','.join(heavy))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "", f"{module} imports {out.stdout.strip()}"


def test_no_script_folder_module_shadows_another():
    """``python sweeps/full.py`` puts sweeps/ first on sys.path, and Ray hands that path to every
    worker: a module there named like a standard-library or installed one (``profile.py``: cProfile
    imports ``profile``, and transformers then failed to import LlamaConfig in every worker) replaces
    it everywhere."""
    import importlib.util

    for path in (ROOT / "sweeps").glob("*.py"):
        name = path.stem
        if name == "__init__":
            continue
        assert name not in sys.stdlib_module_names, f"sweeps/{path.name} shadows the standard library's {name}"
        assert importlib.util.find_spec(name) is None, f"sweeps/{path.name} shadows the installed module {name}"


def test_every_console_command_is_installed_and_answers_help(capsys):
    """Each ``[project.scripts]`` command is installed (its entry point names the same function) and
    its ``--help`` exits 0 with a usage line."""
    import tomllib
    from importlib.metadata import entry_points

    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    installed = {e.name: e for e in entry_points(group="console_scripts")}
    assert len(declared) >= 8
    for name, target in declared.items():
        assert name in installed and installed[name].value == target, \
            f"{name} is not installed as {target}: run make setup (pip install -e .)"
        with pytest.raises(SystemExit) as exit_:
            installed[name].load()(["--help"])
        assert exit_.value.code == 0, name
        assert "usage:" in capsys.readouterr().out, name


def test_no_module_edits_sys_path():
    """The packages are installed (``pip install -e .``; the scripts are console commands too) and the
    benchmarks run as ``python -m benchmarks.<name>`` from the root: nothing needs ``sys.path`` edits."""
    edits = [f"{path.relative_to(ROOT)}:{n}" for pkg in (*PACKAGES, "benchmarks")
             for path in (ROOT / pkg).rglob("*.py")
             for n, line in enumerate(path.read_text().splitlines(), 1)
             if "sys.path.insert" in line or "sys.path.append" in line]
    assert not edits, edits


def test_no_code_outside_a_technique_names_it():
    """A technique is one folder (``trials/techniques/<name>/``) and one dashboard section
    (``dashboard/sections/<name>.py``): nothing else branches on its name or keys a table by it, so a
    new technique needs no line anywhere else. String literals equal to a technique's name are
    looked for in every module of the packages and the benchmarks (docstrings aside): the GPU check's
    trials are each technique's ``device_checks``."""
    from trials import groups

    names = set(groups.NAMES)
    allowed = {   # (file, literal): why it is not a branch on a technique
        ("trials/techniques/stacks/spec.py", "kv_cache"): "the stacks profile's own kv_cache setting",
        ("trials/techniques/stacks/space.py", "kv_cache"): "the stacks profile's own kv_cache setting",
        ("trials/techniques/stacks/space.py", "speculative"): "the design takes k from the speculative runs",
        ("trials/techniques/speculative/runner.py", "baseline"): "the no-speculation run is a baseline config",
        ("sweeps/sweepfile.py", "stacks"): "the sweep file's stacks: key",
        ("benchmarks/overhead.py", "baseline"): "a command-line default: the group it times",
        ("benchmarks/dashboard_scale.py", "baseline"): "the group whose chart it times",
    }
    found = []
    for pkg in (*PACKAGES, "benchmarks"):
        for path in (ROOT / pkg).rglob("*.py"):
            relative = path.relative_to(ROOT).as_posix()
            own = {n for n in names if relative.startswith((f"trials/techniques/{n}/", f"dashboard/sections/{n}.py"))}
            tree = ast.parse(path.read_text(), str(path))
            docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                          if isinstance(node, (ast.Module, ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef))
                          and node.body and isinstance(node.body[0], ast.Expr)
                          and isinstance(node.body[0].value, ast.Constant)}
            for node in ast.walk(tree):
                if (isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in names - own
                        and id(node) not in docstrings and (relative, node.value) not in allowed):
                    found.append(f"{relative}:{node.lineno}: {node.value!r}")
    assert not found, "\n".join(found)


TOY_END_TO_END = """
import sys
import tracking
from dashboard import export, report
from sweeps.spaces import PROFILES
from trials import groups
from trials.run import run_trial

uri, out = sys.argv[1], sys.argv[2]
tracking.prepare_store(uri)
profile = PROFILES["quick"].overridden({"prompts_per_type": 1, "max_new_tokens": 8}, "a test's")
[config] = groups.get("toy").plan(["tiny-gqa"], profile, "cpu")
result = run_trial(config)
assert result.status == "FINISHED", result.error
tracking.log_trial(uri, result)
assert export.main(["--tracking-uri", uri, "--out", out]) == 0
sys.exit(report.main(["--tracking-uri", uri]))
"""


def run_declared_outside(variable: str, module: str, script: str, tmp_path):
    """``script`` in a fresh process with ``module`` (in tests/plugins/) named in ``$variable``, given a fresh
    store and an export path; its completed process (exit code 0 checked) and the export's path."""
    import os

    env = {**os.environ, variable: module,
           "PYTHONPATH": os.pathsep.join([str(ROOT / "tests" / "plugins"), os.environ.get("PYTHONPATH", "")])}
    uri, out = f"sqlite:///{tmp_path / 'mlflow.db'}", tmp_path / "report.html"
    done = subprocess.run([sys.executable, "-c", script, uri, str(out)], capture_output=True,
                          text=True, timeout=600, cwd=ROOT, env=env)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return done, out


def test_a_technique_declared_outside_runs_from_plan_to_export(tiny_zoo, tmp_path):
    """tests/plugins/toy_technique.py, named in $LLM_SWEEPS_TECHNIQUES, is planned, run, logged to a real store,
    drawn by the export and tabled by the report in a fresh process, with no line of the project
    changed: what a technique is lives in its own folder (here, its own module). (The sweep's Ray
    path is the same for every technique: tests/test_sweep.py.)"""
    done, out = run_declared_outside("LLM_SWEEPS_TECHNIQUES", "toy_technique", TOY_END_TO_END, tmp_path)
    assert "Toy: a technique declared outside the project" in out.read_text()
    assert "distinct tokens" in out.read_text()            # the toy section's chart
    assert "distinct tokens |" in done.stdout               # its report table


def test_the_readme_is_a_manual_and_links_the_generated_results():
    """README: at most 200 lines; measured figures live in docs/results.md, which llm-report writes."""
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 200
    assert "(docs/results.md)" in readme and (ROOT / "docs" / "results.md").is_file()
    assert (ROOT / "docs" / "results.md").read_text().startswith("# Results\n\nGenerated ")


def _literals(path: Path) -> list[tuple[int, str]]:
    """A module's string literals, docstrings aside."""
    tree = ast.parse(path.read_text(), str(path))
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    return [(node.lineno, node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings]


def test_no_code_outside_an_engine_names_it():
    """An engine is one folder (``trials/engines/<name>/``): no technique, section, sweep or tracking
    module imports it or names it in a string (docstrings aside), so a new engine needs no line
    anywhere else. The exceptions are the default engine's, said here: the model layer loads every
    model from its HF folder through the default engine's arguments (``trials.models``), and a
    technique whose spec runs on the default engine only may use that engine's own parts (the KV
    cache group's quantized caches, the speculative group's draft loading), and an engine declared
    as built on another (``Engine.builds_on``: llama.cpp's server serves the llama.cpp engine's GGUFs)
    uses that engine's folder."""
    from trials import engines, groups

    names = set(engines.ENGINES)
    only_default = {g.name for g in groups.GROUPS if g.engines == (engines.DEFAULT,)}
    modules = project_modules()
    found = []
    for module, path in modules.items():
        relative = path.relative_to(ROOT).as_posix()
        own = {n for n in names if relative.startswith(f"trials/engines/{n}/")}
        own |= {base for n in own for base in engines.ENGINES[n].builds_on}     # an engine built on another
        for imported, line, _ in imports_of(path, modules):
            parts = imported.split(".")
            if len(parts) < 3 or parts[:2] != ["trials", "engines"] or parts[2] not in names or parts[2] in own:
                continue
            technique = relative.split("/")[2] if relative.startswith("trials/techniques/") else None
            allowed = parts[2] == engines.DEFAULT and (relative.startswith("trials/models/") or technique in only_default)
            if not allowed:
                found.append(f"{relative}:{line}: imports {imported}")
        if relative.startswith("trials/engines/"):
            continue
        for line, text in _literals(path):
            for name in names - {engines.DEFAULT}:
                if re.search(rf"\b{re.escape(name)}\b", text):
                    found.append(f"{relative}:{line}: names the {name} engine in {text[:60]!r}")
    assert not found, "\n".join(found)
