"""Benchmark prompts: four prompt types that stress inference optimizations differently.

The small models this project measures are trained offline on three kinds of text:
the Python standard library's ``.py`` source (code), ``pydoc_data/topics.py`` (English
prose from the Python documentation) and generated structured text (JSON records, CSV
rows, markdown tables).  The prompts below are written for this project in the style of
that training text, so a small model can continue them plausibly.  None is copied
verbatim from a stdlib file.

Speculative-decoding acceptance rates are reported per prompt type, so the types must
genuinely differ in how predictable their continuations are, and *by which mechanism*:

``code``
    Python function and class beginnings that stop mid-body (after ``def ...:`` and an
    indented blank, or after an ``if`` line).  Continuations follow strong syntactic and
    idiomatic regularities that a small *draft model* learns well, but they are mostly
    new tokens, not copies of the prompt, so prompt-lookup (n-gram) speculation gains
    little.  This type shows the draft model's advantage.
``prose``
    Documentation-like English paragraphs that stop mid-sentence.  Word choice is high
    entropy: neither a draft model nor n-gram lookup predicts long runs, so acceptance
    is lowest here.  It is the realistic baseline for speculation, and the most
    sensitive probe of KV-cache quantization fidelity (small logit shifts change which
    word comes next).
``structured``
    JSON records, CSV rows and markdown tables with several rows, stopping mid-record.
    Keys, delimiters and column layout repeat, values change: both speculation methods
    accept the scaffolding and reject the values, giving intermediate acceptance and
    many short accepted runs.
``repetitive``
    Copy-heavy text whose continuation largely repeats material already in the prompt:
    a function to rewrite with a variable renamed, repeated log lines, a paragraph to
    repeat exactly.  Prompt-lookup (n-gram) speculation shines here, since the draft is
    literally found in the context; it also stresses long accepted runs and therefore
    the verification path with many draft tokens per step.

Prompts are 150-600 characters, so prefill stays short and decode dominates the
measured latency; workloads mixing the types are interleaved by type so that any
truncated workload still covers every type.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from trials.models import corpus

PROMPT_TYPES = ("code", "prose", "structured", "repetitive")

MIN_PROMPT_CHARS = 150
MAX_PROMPT_CHARS = 600


@dataclass(frozen=True)
class Prompt:
    """One benchmark prompt; ``id`` is ``"<type>-<NN>"``, e.g. ``"code-03"``."""

    id: str
    type: str
    text: str


_CODE = [
    '''def _split_header_line(line, sep=":"):
    """Split a header line into a (name, value) pair.

    Leading and trailing whitespace is removed from both parts.  A line
    without the separator raises ValueError.
    """
    name, found, value = line.partition(sep)
    if not found:
        ''',
    '''class LimitedQueue:
    """A FIFO queue that drops the oldest item when it is full."""

    def __init__(self, maxsize=16):
        if maxsize < 1:
            raise ValueError("maxsize must be positive")
        self._items = []
        self._maxsize = maxsize

    def put(self, item):
        ''',
    '''def read_config(path, defaults=None):
    """Return a dict of settings read from the file at *path*.

    Blank lines and lines starting with '#' are ignored.
    """
    settings = dict(defaults or {})
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            line = line.strip()
            if not line or line.startswith("#"):
                ''',
    '''def _chunked(iterable, size):
    """Yield lists of at most *size* items taken from *iterable*."""
    if size < 1:
        raise ValueError("size must be at least 1")
    chunk = []
    for item in iterable:
        chunk.append(item)
        if len(chunk) == size:
            ''',
    '''class Interval:
    """A closed interval of numbers [low, high]."""

    __slots__ = ("low", "high")

    def __init__(self, low, high):
        if low > high:
            raise ValueError(f"empty interval: {low!r} > {high!r}")
        self.low = low
        self.high = high

    def __contains__(self, value):
        ''',
    '''def format_size(num_bytes):
    """Return a human readable string such as '1.5 KiB' for *num_bytes*."""
    if num_bytes < 0:
        raise ValueError("size cannot be negative")
    units = ["B", "KiB", "MiB", "GiB", "TiB"]
    size = float(num_bytes)
    for unit in units:
        ''',
    '''def _find_executable(name, search_path=None):
    """Return the full path of *name* on *search_path*, or None."""
    if search_path is None:
        search_path = os.environ.get("PATH", os.defpath)
    for directory in search_path.split(os.pathsep):
        candidate = os.path.join(directory, name)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            ''',
    '''class _Timer:
    """Context manager that records how long its block took to run."""

    def __init__(self, clock=time.perf_counter):
        self._clock = clock
        self.elapsed = None

    def __enter__(self):
        self._start = self._clock()
        return self

    def __exit__(self, exc_type, exc_value, traceback):
        ''',
    '''def merge_sorted(left, right, key=None):
    """Merge two sorted lists into a new sorted list."""
    if key is None:
        key = lambda x: x
    result = []
    i = j = 0
    while i < len(left) and j < len(right):
        if key(right[j]) < key(left[i]):
            ''',
    '''def parse_duration(text):
    """Convert a string like '1h30m' or '45s' into a number of seconds.

    Raise ValueError if the string is not a valid duration.
    """
    factors = {"h": 3600, "m": 60, "s": 1}
    total = 0
    number = ""
    for char in text.strip():
        if char.isdigit():
            ''',
    '''class EventLog:
    def __init__(self):
        self._handlers = {}

    def subscribe(self, event, handler):
        """Register *handler* to be called when *event* is emitted."""
        self._handlers.setdefault(event, []).append(handler)

    def emit(self, event, *args, **kwargs):
        """Call every handler registered for *event*."""
        ''',
    '''def _quote_field(value, delimiter=","):
    """Return *value* quoted for a CSV file if it needs quoting."""
    text = str(value)
    needs_quotes = (
        delimiter in text
        or '"' in text
        or "\\n" in text
        or text != text.strip()
    )
    if needs_quotes:
        ''',
]

_PROSE = [
    """The with statement is used to wrap the execution of a block with methods \
defined by a context manager.  This allows common try...except...finally usage \
patterns to be encapsulated for convenient reuse.  When the block is entered, the \
context manager's __enter__() method is called, and the value it returns is bound to \
the target in the as clause, if""",
    """A module is a file containing Python definitions and statements.  Within a \
module, the module's name is available as the value of the global variable __name__.  \
When a module is imported for the first time, its top-level code is executed once, \
and the resulting module object is cached in sys.modules so that later imports of the \
same name""",
    """Exceptions are raised when an error is detected during execution.  Even if a \
statement or expression is syntactically correct, it may cause an error when an \
attempt is made to execute it.  Most exceptions are not handled by programs, \
however, and result in error messages that show the type of the exception and""",
    """Generators are a simple way of creating iterators.  A generator function looks \
like an ordinary function, except that it contains one or more yield expressions.  \
When the function is called, its body does not run immediately; instead a generator \
object is returned, and the body executes only when the next() function is""",
    """Dictionaries map hashable keys to arbitrary values.  They preserve insertion \
order, so iterating over a dictionary yields its keys in the order in which they \
were first added.  Looking up a key that is not present raises KeyError, unless the \
get() method is used instead, in which case a default value""",
    """Name resolution follows a fixed order.  When a name is used in a code block, it \
is resolved using the nearest enclosing scope.  If the name is bound in the local \
scope, that binding is used; otherwise the enclosing function scopes are searched, \
then the module's global namespace, and finally the""",
    """The import system searches for modules using a sequence of finders.  Each finder \
is asked in turn whether it knows how to locate the requested module.  If a finder \
returns a module spec, the search stops and a loader is used to create and execute \
the module.  If no finder is able to""",
    """Objects are Python's abstraction for data.  Every object has an identity, a type \
and a value.  An object's identity never changes once it has been created; you may \
think of it as the object's address in memory.  The type determines the operations \
that the object supports and also""",
    """Comparison operators may be chained.  For example, x < y <= z is equivalent to \
x < y and y <= z, except that y is evaluated only once.  The comparison is \
short-circuited: when x < y is found to be false, z is not evaluated at all, and \
the result of the whole expression""",
    """A class definition creates a new class object.  The body of the class is \
executed in a new namespace, and the names bound there become the attributes of \
the class.  Methods are ordinary functions defined in the class body; when they are \
looked up through an instance, they are bound to that instance so that""",
    """The garbage collector complements reference counting.  Most objects are freed \
as soon as the last reference to them disappears, but objects that refer to each \
other in a cycle keep their counts above zero.  The collector periodically examines \
container objects to find such cycles and""",
    """String formatting can be done in several ways.  Formatted string literals, \
written with an f prefix, allow expressions to be embedded directly inside \
replacement fields delimited by braces.  The expressions are evaluated at run time \
and their results are converted using the format() protocol, which means that a \
format specification""",
]

_STRUCTURED = [
    """[
  {"id": 101, "name": "alpha", "status": "active", "score": 0.82, "tags": ["core", "fast"]},
  {"id": 102, "name": "bravo", "status": "inactive", "score": 0.47, "tags": ["legacy"]},
  {"id": 103, "name": "charlie", "status": "active", "score": 0.91, "tags": ["core"]},
  {"id": 104, "name": "delta", "status": "pending", "score": 0.65, "tags": ["new", "fast"]},
  {"id": 105, "name": \"""",
    """date,city,temperature_c,humidity,wind_kmh
2024-03-01,Oslo,-2.5,81,14
2024-03-01,Lisbon,15.1,72,9
2024-03-01,Cairo,22.8,35,11
2024-03-02,Oslo,-1.0,77,18
2024-03-02,Lisbon,16.4,69,7
2024-03-02,Cairo,24.0,31,13
2024-03-03,Oslo,0.3,74,21
2024-03-03,Lisbon,""",
    """| Module | Purpose | Added in |
|--------|---------|----------|
| pathlib | Object-oriented filesystem paths | 3.4 |
| asyncio | Asynchronous I/O and event loop | 3.4 |
| statistics | Mathematical statistics functions | 3.4 |
| secrets | Secure random tokens | 3.6 |
| dataclasses | Classes for structured data | 3.7 |
| zoneinfo | IANA time zone support | 3.9 |
| tomllib | """,
    """{"user": "u-3391", "event": "login", "ts": "2024-05-12T08:14:03Z", "ok": true}
{"user": "u-1047", "event": "view", "ts": "2024-05-12T08:14:09Z", "ok": true}
{"user": "u-3391", "event": "purchase", "ts": "2024-05-12T08:15:41Z", "ok": false}
{"user": "u-2210", "event": "login", "ts": "2024-05-12T08:16:02Z", "ok": true}
{"user": "u-1047", "event": \"""",
    """order_id,customer,product,quantity,unit_price,total
5001,Ada Lovelace,notebook,3,2.50,7.50
5002,Alan Turing,pencil,12,0.40,4.80
5003,Grace Hopper,stapler,1,8.99,8.99
5004,Ada Lovelace,eraser,4,0.75,3.00
5005,Edsger Dijkstra,ruler,2,1.20,2.40
5006,Grace Hopper,""",
    """{
  "service": "inventory",
  "version": "2.3.1",
  "replicas": 3,
  "endpoints": [
    {"path": "/items", "method": "GET", "auth": false, "timeout_ms": 500},
    {"path": "/items", "method": "POST", "auth": true, "timeout_ms": 1500},
    {"path": "/items/{id}", "method": "GET", "auth": false, "timeout_ms": 500},
    {"path": "/items/{id}", "method": \"""",
    """| Operation | Average case | Worst case |
|-----------|--------------|------------|
| list.append | O(1) | O(1) |
| list.insert | O(n) | O(n) |
| list.pop() | O(1) | O(1) |
| list.pop(0) | O(n) | O(n) |
| dict lookup | O(1) | O(n) |
| set add | O(1) | O(n) |
| x in list | """,
    """station_id,timestamp,pm25,pm10,no2,status
ST-01,2024-07-01 00:00,12.4,20.1,18.0,ok
ST-01,2024-07-01 01:00,11.9,19.6,16.5,ok
ST-02,2024-07-01 00:00,30.2,44.8,27.3,warn
ST-02,2024-07-01 01:00,28.7,41.0,25.9,warn
ST-03,2024-07-01 00:00,8.1,13.2,9.4,ok
ST-03,2024-07-01 01:00,""",
    """[
  {"isbn": "978-0-13-110362-7", "title": "The C Programming Language", "year": 1978, "pages": 228},
  {"isbn": "978-0-262-51087-5", "title": "Structure and Interpretation", "year": 1985, "pages": 657},
  {"isbn": "978-0-201-63361-0", "title": "Design Patterns", "year": 1994, "pages": 395},
  {"isbn": "978-0-""",
    """| Exit code | Name | Meaning |
|-----------|------|---------|
| 0 | EX_OK | Successful termination |
| 64 | EX_USAGE | Command used incorrectly |
| 65 | EX_DATAERR | Input data was incorrect |
| 66 | EX_NOINPUT | Input file did not exist |
| 69 | EX_UNAVAILABLE | Service unavailable |
| 70 | EX_SOFTWARE | """,
    """name,type,nullable,default,description
id,integer,false,,primary key
email,varchar(255),false,,login address
created_at,timestamp,false,now(),creation time
last_login,timestamp,true,,most recent login
is_admin,boolean,false,false,administrator flag
display_name,""",
    """{"level": "INFO", "module": "scheduler", "msg": "job started", "job": 17, "elapsed_ms": 0}
{"level": "INFO", "module": "scheduler", "msg": "job finished", "job": 17, "elapsed_ms": 842}
{"level": "WARNING", "module": "worker", "msg": "retrying task", "job": 18, "elapsed_ms": 1203}
{"level": "INFO", "module": "worker", "msg": "task done", "job": 18, "elapsed_ms": 1877}
{"level": "ERROR", "module": \"""",
]

_REPETITIVE = [
    '''Rewrite the following function with the variable `total` renamed to `acc`:

def sum_squares(values):
    total = 0
    for v in values:
        total += v * v
    return total

Rewritten:

def sum_squares(values):
    acc = 0
    for v in values:
        ''',
    """2024-06-01 12:00:01 INFO worker-3 heartbeat ok queue=orders lag=0
2024-06-01 12:00:02 INFO worker-3 heartbeat ok queue=orders lag=0
2024-06-01 12:00:03 INFO worker-3 heartbeat ok queue=orders lag=0
2024-06-01 12:00:04 INFO worker-3 heartbeat ok queue=orders lag=0
2024-06-01 12:00:05 INFO worker-3 heartbeat ok queue=orders lag=0
2024-06-01 12:00:06 INFO worker-3 heartbeat ok queue=""",
    """A tuple is an immutable sequence, typically used to store collections of \
heterogeneous data.  Tuples may be constructed with a pair of parentheses, with a \
trailing comma for a singleton, or with the tuple() built-in.

Repeat it exactly:

A tuple is an immutable sequence, typically used to store collections of \
heterogeneous data.  Tuples may be constructed""",
    '''Copy this class unchanged:

class Point:
    def __init__(self, x, y):
        self.x = x
        self.y = y

    def __repr__(self):
        return f"Point({self.x}, {self.y})"

Copy:

class Point:
    def __init__(self, x, y):
        self.x = x
        self.y = y

    def __repr__(self):
        ''',
    """GET /api/health 200 3ms
GET /api/health 200 2ms
GET /api/health 200 3ms
GET /api/health 200 2ms
GET /api/health 200 3ms
GET /api/health 200 2ms
GET /api/health 200 3ms
GET /api/health 200 2ms
GET /api/health 200 3ms
GET /api/health 200 2ms
GET /api/health 200 3ms
GET /api/health 200 2ms
GET /api/""",
    '''Rename the parameter `items` to `records` in this function:

def count_valid(items, check):
    n = 0
    for item in items:
        if check(item):
            n += 1
    return n

Result:

def count_valid(records, check):
    n = 0
    for item in records:
        if check(item):
            n += 1
        ''',
    """Original:
The os.path.join() function joins one or more path components intelligently.  If a \
component is an absolute path, all previous components are thrown away and joining \
continues from the absolute path component.

Copy:
The os.path.join() function joins one or more path components intelligently.  If a \
component is an absolute path, all""",
    """id,name,status
1,alpha,ok
2,beta,ok
3,gamma,ok

And once more:
id,name,status
1,alpha,ok
2,beta,ok
3,gamma,ok

And once more:
id,name,status
1,alpha,ok
2,beta,ok
3,gamma,ok

And once more:
id,name,status
1,alpha,""",
    """Traceback (most recent call last):
  File "app.py", line 12, in <module>
    main()
  File "app.py", line 8, in main
    run(config)
ValueError: invalid config

Traceback (most recent call last):
  File "app.py", line 12, in <module>
    main()
  File "app.py", line 8, in main
    run(config)
ValueError: invalid config

Traceback (most recent call last):
  File "app.py", line 12, in <module>
    main()
  File "app.py", line 8, in""",
    '''Convert the tabs to four spaces; otherwise keep the code identical:

def greet(name, loud=False):
\tmessage = "Hello, " + name
\tif loud:
\t\tmessage = message.upper()
\treturn message

Converted:

def greet(name, loud=False):
    message = "Hello, " + name
    if loud:
        message = message.upper()
    ''',
    """{"status": "ok", "shard": 1, "docs": 500}
{"status": "ok", "shard": 2, "docs": 500}
{"status": "ok", "shard": 3, "docs": 500}
{"status": "ok", "shard": 4, "docs": 500}
{"status": "ok", "shard": 5, "docs": 500}
{"status": "ok", "shard": 6, "docs": 500}
{"status": "ok", "shard": 7, "docs": 500}
{"status": "ok", "shard": 8, "docs": 500}
{"status": "ok", "shard": 9, "docs": 500}
{"status": "ok", "shard": """,
    """Say the sentence below three times.
The quick brown fox jumps over the lazy dog near the riverbank.
1. The quick brown fox jumps over the lazy dog near the riverbank.
2. The quick brown fox jumps over the lazy dog near the riverbank.
3. The quick brown fox jumps over""",
]


def _build(type_: str, texts: list[str]) -> tuple[Prompt, ...]:
    return tuple(Prompt(id=f"{type_}-{i:02d}", type=type_, text=t) for i, t in enumerate(texts))


PROMPTS: dict[str, tuple[Prompt, ...]] = {
    "code": _build("code", _CODE),
    "prose": _build("prose", _PROSE),
    "structured": _build("structured", _STRUCTURED),
    "repetitive": _build("repetitive", _REPETITIVE),
}
"""All prompts, by type, in id order."""

PROMPT_SETS: dict[str, tuple[str, ...]] = {
    "mixed": PROMPT_TYPES,
    **{t: (t,) for t in PROMPT_TYPES},
}
"""Named workloads: each maps to the prompt types it draws from, in interleaving order."""


def workload_prompts(prompt_set: str, per_type: int | None = None) -> list[Prompt]:
    """Return the prompts of workload *prompt_set*, interleaved by type.

    Takes the first *per_type* prompts of each type in the set (all of them when
    ``None``) and interleaves them round-robin: ``code-00, prose-00, structured-00,
    repetitive-00, code-01, ...``, so that a truncated workload still covers every
    type.  Raises ValueError for an unknown set or a *per_type* below 1.
    """
    if prompt_set not in PROMPT_SETS:
        raise ValueError(
            f"unknown prompt set {prompt_set!r}; valid sets: {', '.join(sorted(PROMPT_SETS))}"
        )
    if per_type is not None and (isinstance(per_type, bool) or not isinstance(per_type, int)):
        raise ValueError(f"per_type must be a positive integer or None, got {per_type!r}")
    if per_type is not None and per_type < 1:
        raise ValueError(f"per_type must be at least 1, got {per_type}")
    lists = [PROMPTS[t] if per_type is None else PROMPTS[t][:per_type] for t in PROMPT_SETS[prompt_set]]
    out: list[Prompt] = []
    for i in range(max(len(lst) for lst in lists)):
        out.extend(lst[i] for lst in lists if i < len(lst))
    return out


# --- instruct models ----------------------------------------------------------------------

CHAT_INSTRUCTIONS = {
    "code": "Continue this Python code.",
    "prose": "Continue this paragraph.",
    "structured": "Continue this data in the same format.",
    "repetitive": "Continue this text.",
}
"""What an instruct model is asked, per prompt type, before the prompt's text (its user message)."""


def as_chat(prompts: list[Prompt], tokenizer) -> list[Prompt]:
    """The same prompts as an instruct model is used: one user message (the type's instruction and
    the text) through the tokenizer's chat template, ending where the assistant's reply begins."""
    return [Prompt(p.id, p.type, tokenizer.apply_chat_template(
        [{"role": "user", "content": f"{CHAT_INSTRUCTIONS[p.type]}\n\n{p.text}"}],
        tokenize=False, add_generation_prompt=True)) for p in prompts]


# --- long contexts ------------------------------------------------------------------------

CONTEXT_SOURCES = {"code": "code", "prose": "prose", "structured": "structured", "repetitive": "prose"}
"""Which ``trials.models.corpus`` source fills the context in front of each prompt type."""

CONTEXT_SEPARATOR = "\n\n"
_CONTEXT_SEED = 4321          # structured filler: its own seed, so it is not the zoo's training text
_EXACT_SEARCH_CHARS = 256     # how far around the binary-search cut to look for an exact token count


def extend_to_tokens(prompts: list[Prompt], tokenizer, n_tokens: int) -> list[Prompt]:
    """Each prompt, preceded by text of its own kind, cut from the left to exactly *n_tokens* tokens.

    Long-context trials (the KV cache grows with the context) need prompts of a known token count,
    and the count must hold for the model's own tokenizer (``tokenizer(text)["input_ids"]``, exactly
    as the measurement loop tokenizes). So the text in front is real text of the prompt's kind, from
    ``trials.models.corpus`` (stdlib code before code prompts, Python-docs prose before prose and repetitive
    ones, generated JSON/CSV/markdown before structured ones), the prompt's own ending -- where the
    model continues -- is unchanged, and the cut is at the character where the token count is exactly
    *n_tokens* (found by bisection; counts are near-monotone in the cut). Deterministic for a given
    interpreter and tokenizer. A prompt longer than *n_tokens* loses its beginning. Ids and types are
    kept, so outputs of different stacks still compare prompt by prompt.
    """
    if isinstance(n_tokens, bool) or not isinstance(n_tokens, int) or n_tokens < 1:
        raise ValueError(f"n_tokens must be a positive integer, got {n_tokens!r}")
    return [_extend(p, tokenizer, n_tokens) for p in prompts]


def _extend(prompt: Prompt, tokenizer, n_tokens: int) -> Prompt:
    def count(text: str) -> int:
        return len(tokenizer(text)["input_ids"])

    chars = 8 * n_tokens + 1024
    text = _context_text(CONTEXT_SOURCES[prompt.type], chars) + CONTEXT_SEPARATOR + prompt.text
    while count(text) < n_tokens:
        chars *= 2
        text = _context_text(CONTEXT_SOURCES[prompt.type], chars) + CONTEXT_SEPARATOR + prompt.text
    return Prompt(prompt.id, prompt.type, _exact_text(text, n_tokens, count))


PAD_FILLERS = ("\n", " ", ".")
"""Characters a tokenizer may count one token each, to pad a cut that falls just short (see below)."""


def _exact_text(text: str, n_tokens: int, count) -> str:
    """The end of ``text`` that is exactly ``n_tokens`` tokens (``count(text) >= n_tokens``).

    Usually a cut: the smallest start offset whose count is at most ``n_tokens``, or one nearby that
    hits it exactly. Some tokenizers jump past ``n_tokens`` at every nearby cut (the zoo's 512-token
    one merges differently as a cut moves, e.g. 257 -> 254 tokens for one character); then the
    nearest cut below is padded at its start with ``n_tokens - count`` filler characters that count
    one token each (newlines, for the zoo's tokenizers, which isolate every newline)."""
    lo, hi = 0, len(text)
    while lo < hi:                                   # smallest cut whose count is <= n_tokens
        mid = (lo + hi) // 2
        if count(text[mid:]) <= n_tokens:
            hi = mid
        else:
            lo = mid + 1
    for delta in range(_EXACT_SEARCH_CHARS):
        for cut in (lo - delta, lo + delta):
            if 0 <= cut <= len(text) and count(text[cut:]) == n_tokens:
                return text[cut:]
    short = n_tokens - count(text[lo:])
    for filler in PAD_FILLERS:
        padded = filler * short + text[lo:]
        if count(padded) == n_tokens:
            return padded
    raise ValueError(f"no cut of the context gives exactly {n_tokens} tokens, and no padding fills the gap")


@functools.lru_cache(maxsize=16)
def _context_text(source: str, chars: int) -> str:
    """The first *chars* characters of a corpus source, documents joined (cycled if too short)."""
    budget = max(chars, 64_000)
    if source == "code":
        docs = corpus.code_documents(budget)
    elif source == "prose":
        docs = corpus.prose_documents(budget)
    else:
        docs = corpus.structured_documents(budget, _CONTEXT_SEED)
    joined = CONTEXT_SEPARATOR.join(d.text for d in docs)
    return (joined * (chars // max(1, len(joined)) + 1))[:chars]
