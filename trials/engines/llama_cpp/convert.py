"""llama.cpp's own converter, ``convert_hf_to_gguf.py``: a Hugging Face folder to an F16 GGUF.

The converter is not in llama-cpp-python's wheel; it is in its source package (``vendor/llama.cpp``),
which ``make setup`` compiled. The first conversion on a machine fetches that source package with
pip (its download cache holds it after the build: seconds) and keeps three parts of it, the script,
its ``conversion`` package and its own ``gguf-py`` (the version the script was written against), in
``converter_dir()``. The script runs in a fresh process.

A tokenizer the converter does not recognize (its pre-tokenizer's hash is not in its list: the
project's zoo, trained here) is written as GPT-2's byte-level pre-tokenizer, and the card says so.
Nothing is lost by it: both engines are fed the transformers tokenizer's ids of each prompt, and the
trial logs on how many prompts llama.cpp's own tokenizer agrees (``tokenizer_parity``).
"""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time

from trials.engines.llama_cpp.binding import require_llama_cpp, threads
from trials.errors import ConfigError

CONVERTER_ENV_VAR = "LLM_SWEEPS_LLAMA_CONVERTER"     # a folder holding convert_hf_to_gguf.py, if not fetched
DEFAULT_ROOT = "~/.cache/llm-inference-sweeps/llama-cpp-converter"
SCRIPT = "convert_hf_to_gguf.py"
PARTS = (SCRIPT, "conversion/", "gguf-py/gguf/")     # what is kept of vendor/llama.cpp
FALLBACK_MARK = "llm-sweeps: pre-tokenizer not recognized"
TIMEOUT_S = 3600

# Runs the converter with its own gguf-py first on the path; an unrecognized pre-tokenizer falls
# back to GPT-2's (see the module's docstring) and says so on stderr.
DRIVER = f"""
import runpy, sys
root = sys.argv[1]
sys.path[:0] = [root, root + "/gguf-py"]
from conversion import base
recognized = base.TextModel.get_vocab_base_pre
def get_vocab_base_pre(self, tokenizer):
    try:
        return recognized(self, tokenizer)
    except NotImplementedError:
        print("{FALLBACK_MARK}; written as gpt-2", file=sys.stderr)
        return "gpt-2"
base.TextModel.get_vocab_base_pre = get_vocab_base_pre
sys.argv = [root + "/{SCRIPT}", *sys.argv[2:]]
runpy.run_path(root + "/{SCRIPT}", run_name="__main__")
"""


def converter_dir() -> pathlib.Path:
    """The converter of the installed llama-cpp-python's llama.cpp: ``$LLM_SWEEPS_LLAMA_CONVERTER``, or
    fetched once into ``~/.cache/llm-inference-sweeps/llama-cpp-converter/<version>``."""
    if os.environ.get(CONVERTER_ENV_VAR):
        folder = pathlib.Path(os.environ[CONVERTER_ENV_VAR]).expanduser()
        if not (folder / SCRIPT).is_file():
            raise ConfigError(f"${CONVERTER_ENV_VAR}={folder} holds no {SCRIPT}")
        return folder
    version = require_llama_cpp().__version__
    folder = pathlib.Path(DEFAULT_ROOT).expanduser() / version
    if (folder / SCRIPT).is_file():
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder.parent) as tmp:
        sdist = download_sdist(version, pathlib.Path(tmp))
        staged = pathlib.Path(tmp) / "converter"
        _extract(sdist, staged)
        try:
            os.replace(staged, folder)
        except OSError:              # another worker put it there first
            if not (folder / SCRIPT).is_file():
                raise
    return folder


def download_sdist(version: str, into: pathlib.Path, needed_by: str = "llama.cpp converter",
                   hint: str = f"; or set ${CONVERTER_ENV_VAR} to a llama.cpp checkout holding {SCRIPT}",
                   ) -> pathlib.Path:
    """llama-cpp-python ``version``'s source package, fetched with pip into ``into``: its
    ``vendor/llama.cpp`` holds the converter and the tools (``tools.py``). pip's download cache
    makes a second fetch quick."""
    print(f"{needed_by}: fetching llama-cpp-python {version}'s source package with pip "
          "(once per machine)", file=sys.stderr, flush=True)
    done = subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary",
                           ":all:", f"llama-cpp-python=={version}", "-d", str(into)],
                          capture_output=True, text=True, timeout=1800)
    found = sorted(into.glob("llama_cpp_python-*.tar.gz"))
    if done.returncode != 0 or not found:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise ConfigError(f"{needed_by}: pip could not fetch llama-cpp-python {version}'s source package "
                          f"({last}){hint}")
    return found[0]


def _extract(sdist: pathlib.Path, into: pathlib.Path) -> None:
    with tarfile.open(sdist) as archive:
        for member in archive.getmembers():
            parts = member.name.split("/", 3)        # llama_cpp_python-X/vendor/llama.cpp/<path>
            if len(parts) < 4 or parts[1:3] != ["vendor", "llama.cpp"] or not member.isfile():
                continue
            path = parts[3]
            if not path.startswith(PARTS) or ".." in path.split("/"):
                continue
            target = into / path
            target.parent.mkdir(parents=True, exist_ok=True)
            with archive.extractfile(member) as src, target.open("wb") as dst:
                shutil.copyfileobj(src, dst)
    if not (into / SCRIPT).is_file():
        raise ConfigError(f"{sdist.name} holds no vendor/llama.cpp/{SCRIPT}")


def convert(folder: pathlib.Path, target: pathlib.Path, outtype: str = "f16") -> dict:
    """``convert_hf_to_gguf.py FOLDER --outtype OUTTYPE`` into ``target`` (written under a temporary
    name); its card entry. ConfigError, with the converter's last line, where it cannot."""
    root = converter_dir()
    tmp = target.with_name(f".{target.name}.{os.getpid()}")
    started = time.perf_counter()
    print(f"llama.cpp converter: {folder.name} to {outtype.upper()} GGUF", file=sys.stderr, flush=True)
    env = {**os.environ, "OMP_NUM_THREADS": str(threads())}    # the cores this trial was granted
    done = subprocess.run([sys.executable, "-c", DRIVER, str(root), str(folder), "--outtype", outtype,
                           "--outfile", str(tmp)], capture_output=True, text=True, timeout=TIMEOUT_S, env=env)
    if done.returncode != 0 or not tmp.is_file():
        tmp.unlink(missing_ok=True)
        lines = [line for line in done.stderr.strip().splitlines() if line.strip()] or ["no output"]
        raise ConfigError(f"llama.cpp's converter could not convert {folder.name}: {lines[-1].strip()}")
    os.replace(tmp, target)
    return {"gguf_type": outtype, "file": target.name, "bytes": target.stat().st_size,
            "origin": f"{SCRIPT} from {folder.name}", "converter": str(root),
            "llama_cpp_python": require_llama_cpp().__version__,
            "pre_tokenizer": "gpt-2 (not recognized by the converter)" if FALLBACK_MARK in done.stderr
            else "recognized", "convert_s": round(time.perf_counter() - started, 2)}
