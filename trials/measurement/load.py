"""A load generator for an OpenAI-compatible streaming completions endpoint (llama-server, vLLM, ...).

Why open loop. A closed-loop client (N requests in flight, the next sent when one finishes) slows
down with the server, so it never shows queueing: latency stays flat while throughput saturates. An
open-loop client sends each request at its scheduled offset whatever the server does, so an
overloaded server shows up as growing TTFT and falling achieved/offered rate. Both modes are here:
``arrivals`` (open loop, usually ``poisson_arrivals``) or ``concurrency`` (closed loop).

What is recorded, per request, on the client's clock (``time.perf_counter`` seconds from the point's
start): when it was scheduled, sent, each streamed chunk that carried tokens, done, and any error.
``sent_s - scheduled_s`` is the client's own lag: a client too busy to send on time understates the
offered load, so the lag and the client's CPU time are recorded beside the latencies. Failures
(HTTP errors, refused or dropped connections, timeouts, a stream without ``[DONE]``, or, for a server
that sends no ``[DONE]`` (``ends_with_done=False``), one that ends before a chunk with a
``finish_reason``) become the record's ``error``; ``drive`` itself never raises for them, so a point
whose server dies keeps what it measured. asyncio and aiohttp in one thread; torch-free.
"""

from __future__ import annotations

import asyncio
import errno
import json
import math
import random
import time
from dataclasses import asdict, dataclass, field, fields

import aiohttp

ERROR_CHARS = 300               # an error is one line, at most this long
STOPPED = "stopped: "           # the error of a request a point stopped early did not send or finish


@dataclass(frozen=True)
class Request:
    prompt_id: str
    prompt: list[int] | str     # token ids or text, sent as the completions API's ``prompt``
    max_tokens: int


@dataclass
class RequestRecord:
    """One request's timeline (seconds from the point's start, client clock) and outcome."""

    prompt_id: str
    scheduled_s: float          # open loop: its arrival offset; closed loop: when its slot came free
    sent_s: float = math.nan
    first_token_s: float | None = None
    token_s: list[float] = field(default_factory=list)      # arrival of each chunk that carried tokens
    chunk_tokens: list[int] = field(default_factory=list)   # tokens in each of those chunks (1 unless the server says)
    done_s: float = math.nan
    output_tokens: int = 0      # usage.completion_tokens when the server reports it, else sum(chunk_tokens)
    prompt_tokens: int = 0      # usage.prompt_tokens, 0 when not reported
    error: str = ""             # "" when ok; one line
    finish_reason: str = ""     # the last choice's ``finish_reason`` ("length", "stop"), "" until one came
    server_timings: dict = field(default_factory=dict)      # llama-server's non-standard ``timings``

    @property
    def ok(self) -> bool:
        return not self.error

    @property
    def client_lag_s(self) -> float:
        """How late the client sent it (sent - scheduled): the client's fault, not the server's."""
        return self.sent_s - self.scheduled_s

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token_s is None else self.first_token_s - self.sent_s

    @property
    def e2e_s(self) -> float:
        return self.done_s - self.sent_s

    @property
    def itl_s(self) -> list[float]:
        """Gaps between consecutive token-carrying chunks."""
        return [b - a for a, b in zip(self.token_s, self.token_s[1:])]

    @property
    def tpot_s(self) -> float | None:
        """Decode time per output token after the first; None below two tokens."""
        if self.first_token_s is None or self.output_tokens < 2:
            return None
        return (self.done_s - self.first_token_s) / (self.output_tokens - 1)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> RequestRecord:
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


@dataclass
class PointRun:
    """One load point: its records (in the order of the requests given), and the client's own cost."""

    records: list[RequestRecord]
    wall_s: float               # first send to last done
    client_cpu_s: float         # the process's CPU time over the point: a saturated client shows here
    offered_rps: float | None   # open loop: requests / last arrival offset; closed loop: None
    concurrency: int | None     # closed loop: requests in flight; open loop: None
    mode: str                   # "poisson" | "concurrency"

    def to_dict(self) -> dict:
        return {**asdict(self), "records": [r.to_dict() for r in self.records]}

    @classmethod
    def from_dict(cls, data: dict) -> PointRun:
        return cls(**{**data, "records": [RequestRecord.from_dict(r) for r in data["records"]]})


def poisson_arrivals(rate_per_s: float, count: int, seed: int) -> list[float]:
    """Send offsets (s from the point's start) of a Poisson process: seeded exponential gaps, mean
    1/rate. The first arrival is at the first gap, not at 0, so ``count`` offsets span ``count``
    gaps and ``count / offsets[-1]`` is the maximum-likelihood estimate of the rate."""
    if rate_per_s <= 0 or count < 0:
        raise ValueError(f"rate_per_s must be > 0 and count >= 0, got {rate_per_s}, {count}")
    rng = random.Random(seed)
    offsets, t = [], 0.0
    for _ in range(count):
        t += rng.expovariate(rate_per_s)
        offsets.append(t)
    return offsets


class StreamError(Exception):
    """The server reported an error inside the stream, or the stream ended without ``[DONE]``."""


def one_line(text: str) -> str:
    return " ".join(str(text).split())[:ERROR_CHARS]


def describe(exc: BaseException, timeout_s: float) -> str:
    """A failed request's error line."""
    if isinstance(exc, TimeoutError):
        return f"timeout after {timeout_s:g} s"
    if isinstance(exc, aiohttp.ClientConnectorError):
        if isinstance(exc.os_error, ConnectionRefusedError) or exc.errno == errno.ECONNREFUSED:
            return "connection refused"
        return one_line(f"cannot connect: {exc}")
    if isinstance(exc, (aiohttp.ServerDisconnectedError, aiohttp.ClientPayloadError, ConnectionError)):
        return one_line(f"connection dropped: {type(exc).__name__}: {exc}")
    return one_line(f"{type(exc).__name__}: {exc}")


def chunk_token_count(chunk: dict, choice: dict, counted: int) -> int:
    """Tokens one streamed chunk carried: the OpenAI logprobs' token list, llama-server's ``tokens``,
    or the growth of a running ``usage.completion_tokens`` (vLLM's continuous usage); else 1."""
    for tokens in ((choice.get("logprobs") or {}).get("tokens"), choice.get("tokens"), chunk.get("tokens")):
        if isinstance(tokens, list) and tokens:
            return len(tokens)
    running = (chunk.get("usage") or {}).get("completion_tokens")
    return max(running - counted, 1) if isinstance(running, int) else 1


def take_chunk(record: RequestRecord, chunk: dict, now: float) -> None:
    """Fold one parsed ``data:`` chunk into the record: token arrival, usage, timings, errors."""
    if "error" in chunk:
        raise StreamError(one_line(f"server error: {json.dumps(chunk['error'])}"))
    usage = chunk.get("usage") or {}
    choices = chunk.get("choices") or []
    choice = choices[0] if choices else {}
    carried = bool(choice.get("text")) or bool(choice.get("tokens")) or bool(chunk.get("tokens"))
    if carried:
        record.chunk_tokens.append(chunk_token_count(chunk, choice, sum(record.chunk_tokens)))
        record.token_s.append(now)
        if record.first_token_s is None:
            record.first_token_s = now
    if isinstance(usage.get("completion_tokens"), int):
        record.output_tokens = usage["completion_tokens"]
    if isinstance(usage.get("prompt_tokens"), int):
        record.prompt_tokens = usage["prompt_tokens"]
    if isinstance(chunk.get("timings"), dict):
        record.server_timings = chunk["timings"]
    if choice.get("finish_reason"):
        record.finish_reason = str(choice["finish_reason"])


async def read_stream(response: aiohttp.ClientResponse, record: RequestRecord, t0: float,
                      ends_with_done: bool = True) -> None:
    """Parse the SSE body (``data: {...}`` lines up to ``data: [DONE]``), stamping each chunk. A
    server that sends no ``[DONE]`` (``ends_with_done=False``) is done when its stream closes after
    a chunk that carried a ``finish_reason``."""
    async for raw in response.content:
        now = time.perf_counter() - t0
        line = raw.decode("utf-8", "replace").strip()
        if line.startswith("error:"):
            raise StreamError(one_line(f"server error: {line[6:].strip()}"))
        if not line.startswith("data:"):
            continue                    # blank separators, comments, event: lines
        data = line[5:].strip()
        if data == "[DONE]":
            return
        take_chunk(record, json.loads(data), now)
    if ends_with_done:
        raise StreamError("stream ended before [DONE]")
    if not record.finish_reason:
        raise StreamError("stream ended before a chunk with a finish_reason")


class Client:
    """The shared state of one point: session, clock origin, request body, and whether the server
    has gone (a refused connection: the requests not yet sent are then recorded as not sent)."""

    def __init__(self, session: aiohttp.ClientSession, url: str, timeout_s: float, body: dict | None,
                 ends_with_done: bool = True):
        self.session, self.url, self.timeout_s, self.body = session, url, timeout_s, body or {}
        self.ends_with_done = ends_with_done
        self.t0 = time.perf_counter()
        self.gone = ""
        self.stopped = ""               # why the point stopped early (``stop``), "" while it runs
        self.first_sent: float | None = None
        self.last_done = 0.0

    def now(self) -> float:
        return time.perf_counter() - self.t0

    def payload(self, request: Request) -> dict:
        return {"prompt": request.prompt, "max_tokens": request.max_tokens, "temperature": 0,
                "stream": True, "stream_options": {"include_usage": True}, **self.body}

    async def send(self, request: Request, scheduled_s: float) -> RequestRecord:
        """Send one request now and follow its stream to the end; never raises."""
        record = RequestRecord(request.prompt_id, scheduled_s)
        if self.stopped:
            record.sent_s = record.done_s = scheduled_s
            record.error = f"{STOPPED}not sent ({self.stopped})"
            return record
        if self.gone:
            record.sent_s = record.done_s = scheduled_s
            record.error = f"not sent: server unreachable ({self.gone})"
            return record
        record.sent_s = self.now()
        self.first_sent = record.sent_s if self.first_sent is None else self.first_sent
        try:
            async with asyncio.timeout(self.timeout_s):
                async with self.session.post(f"{self.url}/v1/completions", json=self.payload(request)) as response:
                    if response.status != 200:
                        text = await response.text(errors="replace")
                        raise StreamError(one_line(f"HTTP {response.status}: {text}"))
                    await read_stream(response, record, self.t0, self.ends_with_done)
        except asyncio.CancelledError:         # the point stopped early (``open_loop``'s stop)
            record.error = f"{STOPPED}cancelled in flight ({self.stopped})"
        except StreamError as exc:
            record.error = str(exc)
        except Exception as exc:                # one request's failure is a measurement, not a crash
            record.error = describe(exc, self.timeout_s)
            if record.error == "connection refused":
                self.gone = record.error
        record.done_s = self.now()
        record.output_tokens = record.output_tokens or sum(record.chunk_tokens)
        self.last_done = max(self.last_done, record.done_s)
        return record


async def open_loop(client: Client, requests: list[Request], arrivals: list[float],
                    stop=None) -> list[RequestRecord]:
    """Each request is sent at its offset, whether or not earlier ones have finished. ``stop``
    (records finished so far -> a reason, or "") is asked as each request finishes: once it gives a
    reason, nothing more is sent and the requests in flight are cancelled (their records say so)."""
    tasks, finished = [], []

    def done(task: asyncio.Task) -> None:
        if task.cancelled() or client.stopped:
            return
        finished.append(task.result())
        reason = stop(finished)
        if reason:
            client.stopped = reason
            for other in tasks:
                other.cancel()

    for request, offset in zip(requests, arrivals):
        delay = offset - client.now()
        if delay > 0 and not client.gone and not client.stopped:
            await asyncio.sleep(delay)
        task = asyncio.create_task(client.send(request, offset))
        if stop is not None:
            task.add_done_callback(done)
        tasks.append(task)
    return list(await asyncio.gather(*tasks))


async def closed_loop(client: Client, requests: list[Request], concurrency: int) -> list[RequestRecord]:
    """``concurrency`` workers, each sending its next request as soon as its previous one is done."""
    records: list[RequestRecord | None] = [None] * len(requests)
    queue = iter(enumerate(requests))

    async def worker() -> None:
        free_at = 0.0
        for index, request in queue:
            records[index] = await client.send(request, free_at)
            free_at = client.now()

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return records


async def drive(url: str, requests: list[Request], *, arrivals: list[float] | None = None,
                concurrency: int | None = None, timeout_s: float = 300, body: dict | None = None,
                ends_with_done: bool = True, stop=None) -> PointRun:
    """Run one load point against ``{url}/v1/completions`` (streaming, greedy, usage included;
    ``body`` adds or overrides fields, e.g. ``{"ignore_eos": True, "cache_prompt": False}``;
    ``ends_with_done``: whether the server closes each stream with ``data: [DONE]``).
    Exactly one of ``arrivals`` (open loop: one offset per request, seconds from the point's start)
    or ``concurrency`` (closed loop). Records come back in the order of ``requests``. ``stop``
    (open loop only): ``open_loop``'s early stop; the requests it left are records whose error starts
    with ``STOPPED``."""
    if (arrivals is None) == (concurrency is None):
        raise ValueError("give exactly one of arrivals (open loop) or concurrency (closed loop)")
    if arrivals is not None and len(arrivals) != len(requests):
        raise ValueError(f"{len(arrivals)} arrivals for {len(requests)} requests")
    if concurrency is not None and concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    # limit=0: the connector's default pool of 100 would silently queue an open loop's sends;
    # force_close: a new connection per request (a server may close an idle kept-alive one, and
    # the next request written into it fails with "Can not write request body")
    connector = aiohttp.TCPConnector(limit=0, force_close=True)
    cpu0 = time.process_time()
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None)) as session:
        client = Client(session, url.rstrip("/"), timeout_s, body, ends_with_done)
        if arrivals is not None:
            records = await open_loop(client, requests, arrivals, stop)
        else:
            records = await closed_loop(client, requests, concurrency)
    first = client.first_sent if client.first_sent is not None else 0.0
    offered = len(requests) / arrivals[-1] if arrivals and arrivals[-1] > 0 else None
    return PointRun(records=records, wall_s=max(client.last_done - first, 0.0),
                    client_cpu_s=time.process_time() - cpu0, offered_rps=offered,
                    concurrency=concurrency, mode="poisson" if arrivals is not None else "concurrency")


def run_point(url: str, requests: list[Request], *, arrivals: list[float] | None = None,
              concurrency: int | None = None, timeout_s: float = 300, body: dict | None = None,
              ends_with_done: bool = True, stop=None) -> PointRun:
    """``drive`` from synchronous code (its own event loop)."""
    return asyncio.run(drive(url, requests, arrivals=arrivals, concurrency=concurrency, stop=stop,
                             timeout_s=timeout_s, body=body, ends_with_done=ends_with_done))
