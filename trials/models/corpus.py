"""Training text for the offline model zoo, built from what every Python install has.

Three sources, so that prompt types differ in the sweeps (code, prose, structured data):

* ``code``: ``.py`` files of the running interpreter's standard library. Files are picked in a
  fixed pseudo-random order (CRC32 of the relative path) rather than alphabetically, so a small
  byte budget still covers many packages instead of only ``asyncio`` and ``collections``.
  Tests, idlelib, tkinter, other odd corners and files that are mostly literal tables are skipped.
* ``prose``: the English help texts in ``pydoc_data/topics.py`` (the ``topics`` dict, ~460 KB),
  in key order.
* ``structured``: JSON records (pretty and JSON Lines), CSV tables and markdown tables generated
  here from a seeded ``random.Random``, so they are identical on every machine.

Each source is split into documents; the last documents of each source (about
``heldout_fraction`` of its bytes, at least one document) are held out for perplexity. The
split is by document, so no held-out text was ever seen in training.

Everything here is deterministic for a given interpreter: ``corpus_hash`` changes when the
stdlib files change (another Python version), which makes the zoo rebuild.
"""

from __future__ import annotations

import csv
import functools
import hashlib
import io
import json
import os
import random
import re
import sysconfig
import zlib
from dataclasses import dataclass

from trials.errors import ConfigError

SOURCES = ("code", "prose", "structured")

# Stdlib folders left out of the code source: tests (huge, repetitive), GUI code, vendored
# installers, generated data, pydoc_data (that one is the prose source); also the
# platform-specific ``config-*`` folder.
SKIPPED_STDLIB_DIRS = frozenset({
    "test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__", "lib2to3",
    "idlelib", "turtledemo", "ensurepip", "pydoc_data", "tkinter", "unittest", "encodings",
})
MIN_CODE_FILE_BYTES = 1_000
MAX_CODE_FILE_BYTES = 80_000
# Files that are mostly literal tables (html/entities.py, locale.py, stringprep.py, ...) are data,
# not code: a small model memorizes them and greedy decoding drifts into endless table rows.
DATA_LINE = re.compile(r"""^\s*(['"].*['"]|\d+|0x[0-9a-fA-F]+)\s*[:,]""")
MAX_DATA_LINE_FRACTION = 0.3


@dataclass(frozen=True)
class Document:
    source: str  # one of SOURCES
    name: str  # stdlib relative path, topic key, or generated id
    text: str


@dataclass(frozen=True)
class CorpusSpec:
    """How much text of each source a zoo set trains on (bytes, approximate upper bounds)."""

    code_bytes: int
    prose_bytes: int
    structured_bytes: int
    heldout_fraction: float = 0.05
    seed: int = 1234  # for the generated structured text


@dataclass(frozen=True)
class PerplexityMethod:
    """Which held-out text, and how it is cut into scored windows (``trials.measurement.perplexity``).

    The zoo's models are scored on their set's held-out documents (``corpus``, mixed by ``weights``);
    real pretrained models on ``real_text()``, a fixed English text that ships with the system and
    that neither they nor the zoo trained on as such (``text_file``). ``bos``: each window starts with
    the tokenizer's BOS (models trained that way, e.g. Gemma), so it holds ``context - 1`` text tokens.
    """

    corpus: CorpusSpec | None
    context: int                                  # tokens per window
    stride: int                                   # tokens between window starts
    windows: int                                  # over all sources, split by ``weights``
    weights: tuple[tuple[str, float], ...] = ()
    text_file: str = ""
    bos: bool = False

    def describe(self) -> str:
        if self.text_file:
            return (f"strided sliding window: context {self.context}, stride {self.stride}, "
                    f"{self.windows} windows of {self.text_file}" + (", BOS at each window's start" if self.bos else ""))
        mix = "/".join(f"{s} {w:.0%}" for s, w in self.weights)
        return (f"strided sliding window: context {self.context}, stride {self.stride}, "
                f"{self.windows} windows of zoo held-out text ({mix})")


# Real English text for real models' perplexity: the GNU GPL v3 as Debian ships it (the same text
# everywhere), else the license of the running Python. Not the zoo's training text.
REAL_TEXT_FILES = ("/usr/share/common-licenses/GPL-3",)


def real_text() -> str:
    """Path of the held-out real-text file for real models' perplexity (ConfigError when none)."""
    candidates = [*REAL_TEXT_FILES, os.path.join(sysconfig.get_paths()["stdlib"], "LICENSE.txt")]
    for path in candidates:
        if os.path.isfile(path):
            return path
    raise ConfigError(f"no real text for perplexity: none of {', '.join(candidates)} exists")


@dataclass(frozen=True)
class Corpus:
    spec: CorpusSpec
    train: dict[str, tuple[Document, ...]]
    heldout: dict[str, tuple[Document, ...]]
    corpus_hash: str

    def all_train_texts(self) -> list[str]:
        return [doc.text for source in SOURCES for doc in self.train[source]]

    def total_bytes(self) -> int:
        return sum(
            len(doc.text.encode()) for part in (self.train, self.heldout)
            for docs in part.values() for doc in docs
        )


def stdlib_dir() -> str:
    return sysconfig.get_paths()["stdlib"]


def code_documents(byte_budget: int) -> list[Document]:
    root = stdlib_dir()
    candidates = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in SKIPPED_STDLIB_DIRS and not d.startswith("config-"))
        for file_name in files:
            if not file_name.endswith(".py"):
                continue
            path = os.path.join(folder, file_name)
            size = os.path.getsize(path)
            if MIN_CODE_FILE_BYTES <= size <= MAX_CODE_FILE_BYTES:
                rel = os.path.relpath(path, root).replace(os.sep, "/")
                candidates.append((zlib.crc32(rel.encode()), rel, path))
    docs, used = [], 0
    for _, rel, path in sorted(candidates):
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
        if used + len(text) > byte_budget or _mostly_data(text):
            continue
        docs.append(Document("code", rel, text))
        used += len(text)
    return docs


def _mostly_data(text: str) -> bool:
    lines = text.splitlines()
    return sum(1 for line in lines if DATA_LINE.match(line)) > MAX_DATA_LINE_FRACTION * max(1, len(lines))


def prose_documents(byte_budget: int) -> list[Document]:
    from pydoc_data.topics import topics

    docs, used = [], 0
    for key in sorted(topics):
        text = topics[key].strip() + "\n"
        if used + len(text) > byte_budget:
            continue
        docs.append(Document("prose", key, text))
        used += len(text)
    return docs


# --- generated structured text -----------------------------------------------------------

FIRST_NAMES = ("Ada", "Alan", "Grace", "Linus", "Guido", "Barbara", "Ken", "Dennis", "Margaret",
               "Edsger", "Donald", "Frances", "John", "Katherine", "Tim", "Radia", "Bjarne",
               "Anita", "Niklaus", "Sophie", "Yukihiro", "Hedy", "Claude", "Leslie")
LAST_NAMES = ("Lovelace", "Turing", "Hopper", "Torvalds", "van Rossum", "Liskov", "Thompson",
              "Ritchie", "Hamilton", "Dijkstra", "Knuth", "Allen", "McCarthy", "Johnson",
              "Berners-Lee", "Perlman", "Stroustrup", "Borg", "Wirth", "Wilson", "Matsumoto",
              "Lamarr", "Shannon", "Lamport")
CITIES = ("Amsterdam", "Berlin", "Boston", "Cairo", "Delhi", "Lagos", "Lima", "Lisbon", "London",
          "Madrid", "Montreal", "Nairobi", "Oslo", "Paris", "Seoul", "Sydney", "Tokyo", "Toronto",
          "Vienna", "Warsaw", "Zurich")
PRODUCTS = ("keyboard", "monitor", "laptop", "mouse", "headset", "webcam", "router", "cable",
            "charger", "speaker", "tablet", "printer", "scanner", "microphone", "dock", "ssd")
CATEGORIES = ("electronics", "office", "audio", "networking", "storage", "accessories")
STATUSES = ("pending", "shipped", "delivered", "cancelled", "returned")
EVENTS = ("login", "logout", "page_view", "click", "purchase", "signup", "error", "search")
REGIONS = ("North", "South", "East", "West", "Central")
METRICS = ("latency_ms", "throughput", "error_rate", "cpu_pct", "memory_mb")
WORDS = ("fast", "blue", "quiet", "smart", "compact", "pro", "mini", "ultra", "classic", "eco")


def _person(rng: random.Random) -> tuple[str, str]:
    first, last = rng.choice(FIRST_NAMES), rng.choice(LAST_NAMES)
    email = f"{first.lower()}.{last.lower().replace(' ', '')}@example.{rng.choice(['com', 'org', 'net'])}"
    return f"{first} {last}", email


def _date(rng: random.Random) -> str:
    return f"20{rng.randint(18, 26)}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"


def _json_record(rng: random.Random, kind: str, index: int) -> dict:
    if kind == "users":
        name, email = _person(rng)
        return {"id": index, "name": name, "email": email, "city": rng.choice(CITIES),
                "age": rng.randint(18, 80), "active": rng.random() < 0.7,
                "tags": rng.sample(WORDS, rng.randint(0, 3)), "joined": _date(rng)}
    if kind == "orders":
        items = [{"product": rng.choice(PRODUCTS), "quantity": rng.randint(1, 5),
                  "price": round(rng.uniform(2, 900), 2)} for _ in range(rng.randint(1, 3))]
        return {"order_id": f"ORD-{rng.randint(10000, 99999)}", "customer_id": rng.randint(1, 999),
                "status": rng.choice(STATUSES), "items": items,
                "total": round(sum(i["price"] * i["quantity"] for i in items), 2),
                "created_at": _date(rng)}
    return {"event": rng.choice(EVENTS), "user_id": rng.randint(1, 999),
            "timestamp": f"{_date(rng)}T{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}:{rng.randint(0, 59):02d}Z",
            "duration_ms": rng.randint(1, 5000), "success": rng.random() < 0.9}


def _json_document(rng: random.Random) -> str:
    kind = rng.choice(("users", "orders", "events"))
    start = rng.randint(1, 500)
    records = [_json_record(rng, kind, start + i) for i in range(rng.randint(3, 8))]
    if rng.random() < 0.5:
        return json.dumps({kind: records}, indent=2) + "\n"
    return "".join(json.dumps(r) + "\n" for r in records)


def _csv_document(rng: random.Random) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    kind = rng.choice(("products", "measurements", "employees"))
    rows = rng.randint(5, 25)
    if kind == "products":
        writer.writerow(["sku", "name", "category", "price", "stock"])
        for _ in range(rows):
            writer.writerow([f"SKU-{rng.randint(1000, 9999)}", f"{rng.choice(WORDS)} {rng.choice(PRODUCTS)}",
                             rng.choice(CATEGORIES), f"{rng.uniform(2, 900):.2f}", rng.randint(0, 500)])
    elif kind == "measurements":
        writer.writerow(["date", "host", "metric", "value"])
        for _ in range(rows):
            writer.writerow([_date(rng), f"node-{rng.randint(1, 16):02d}", rng.choice(METRICS),
                             f"{rng.uniform(0, 1000):.3f}"])
    else:
        writer.writerow(["id", "name", "email", "city", "salary"])
        for i in range(rows):
            name, email = _person(rng)
            writer.writerow([i + 1, name, email, rng.choice(CITIES), rng.randrange(30000, 200000, 500)])
    return out.getvalue()


def _markdown_document(rng: random.Random) -> str:
    if rng.random() < 0.5:
        quarters = ["Q1", "Q2", "Q3", "Q4"]
        lines = [f"## Sales by region, {rng.randint(2018, 2026)}", "",
                 "| Region | " + " | ".join(quarters) + " | Total |",
                 "| --- | " + " | ".join("---:" for _ in quarters) + " | ---: |"]
        for region in rng.sample(REGIONS, rng.randint(3, len(REGIONS))):
            values = [rng.randint(100, 9999) for _ in quarters]
            lines.append(f"| {region} | " + " | ".join(str(v) for v in values) + f" | {sum(values)} |")
    else:
        lines = [f"### Team directory: {rng.choice(CITIES)} office", "",
                 "| Name | Role | Email | Since |", "| --- | --- | --- | --- |"]
        for _ in range(rng.randint(3, 8)):
            name, email = _person(rng)
            role = rng.choice(("engineer", "manager", "designer", "analyst", "researcher"))
            lines.append(f"| {name} | {role} | {email} | {rng.randint(2010, 2026)} |")
    return "\n".join(lines) + "\n"


def structured_documents(byte_budget: int, seed: int) -> list[Document]:
    rng = random.Random(seed)
    makers = (("json", _json_document), ("csv", _csv_document), ("markdown", _markdown_document))
    docs, used, index = [], 0, 0
    while used < byte_budget:
        kind, make = makers[index % len(makers)]
        text = make(rng)
        docs.append(Document("structured", f"{kind}-{index:05d}", text))
        used += len(text)
        index += 1
    return docs


# --- assembly -----------------------------------------------------------------------------

def _split_heldout(docs: list[Document], fraction: float) -> tuple[tuple[Document, ...], tuple[Document, ...]]:
    """Hold out the last documents, about `fraction` of the bytes and at least one document."""
    total = sum(len(d.text) for d in docs)
    held, held_bytes = [], 0
    for doc in reversed(docs):
        if held and held_bytes >= fraction * total:
            break
        held.append(doc)
        held_bytes += len(doc.text)
    cut = len(docs) - len(held)
    return tuple(docs[:cut]), tuple(docs[cut:])


@functools.lru_cache(maxsize=4)
def build_corpus(spec: CorpusSpec) -> Corpus:
    by_source = {
        "code": code_documents(spec.code_bytes),
        "prose": prose_documents(spec.prose_bytes),
        "structured": structured_documents(spec.structured_bytes, spec.seed),
    }
    train, heldout = {}, {}
    digest = hashlib.sha256()
    for source in SOURCES:
        train[source], heldout[source] = _split_heldout(by_source[source], spec.heldout_fraction)
        for part, docs in (("train", train[source]), ("heldout", heldout[source])):
            for doc in docs:
                digest.update(f"{part}\0{source}\0{doc.name}\0".encode())
                digest.update(doc.text.encode("utf-8", errors="replace"))
                digest.update(b"\0")
    return Corpus(spec, train, heldout, digest.hexdigest()[:16])
