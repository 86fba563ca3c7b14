"""The serving load generator against a real local SSE server, and the serving statistics on traces
whose answers are worked out by hand.

The server (``SseServer``) is a small aiohttp app in its own thread and event loop that streams
OpenAI-style completion chunks like llama-server: a per-token delay, chunks of several tokens, usage
and ``timings`` in the last chunk, and on request an HTTP 500, a connection dropped mid-stream, a
stream without ``[DONE]``, or its own death. It counts requests in flight, so the client's
concurrency is checked from the server's side.
"""

from __future__ import annotations

import asyncio
import json
import math
import statistics
import threading

import numpy as np
import pytest
from aiohttp import web
from scipy import stats

from trials.measurement.load import PointRun, Request, RequestRecord, poisson_arrivals, run_point
from trials.stats.serving import (MIN_FOR, Slo, keeps_up, percentile_with_interval, saturation_rps,
                                  summarize, sustainable)

TIMINGS = {"prompt_n": 3, "prompt_ms": 1.5, "predicted_n": 5, "predicted_ms": 10.0}


class SseServer:
    """``POST /v1/completions`` streaming ``max_tokens`` tokens. The prompt picks a behaviour:
    ``fail`` (HTTP 500), ``drop`` (connection closed after two chunks), ``short`` (no ``[DONE]``),
    ``die`` (answers, then the server shuts down); body extras: ``delay_s`` per chunk,
    ``tokens_per_chunk``, ``no_usage``."""

    def __init__(self) -> None:
        self.in_flight = self.max_in_flight = 0
        self.bodies: list[dict] = []
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.runner: web.AppRunner | None = None

    def start(self) -> str:
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self.serve(), self.loop).result(10)
        host, port = self.runner.addresses[0][:2]
        return f"http://{host}:{port}"

    async def serve(self) -> None:
        app = web.Application()
        app.router.add_post("/v1/completions", self.completions)
        self.runner = web.AppRunner(app, access_log=None, shutdown_timeout=1)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", 0).start()   # port 0: a free one

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()

    def reset(self) -> None:
        self.in_flight = self.max_in_flight = 0
        self.bodies.clear()

    async def completions(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.bodies.append(body)
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        if body["prompt"] == "fail":
            self.in_flight -= 1
            return web.Response(status=500, text="boom\nsecond line")
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        if not await self.stream_tokens(request, response, body):
            return response
        self.in_flight -= 1           # before the last bytes: the client may send its next request on them
        await response.write(sse(self.final_chunk(body)))
        if body["prompt"] != "short":
            await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        if body["prompt"] == "die":
            self.loop.create_task(self.runner.cleanup())
        return response

    async def stream_tokens(self, request, response, body) -> bool:
        """Stream the tokens; False when the connection was dropped on purpose."""
        sent, per_chunk = 0, body.get("tokens_per_chunk", 1)
        while sent < body["max_tokens"]:
            await asyncio.sleep(body.get("delay_s", 0.0))
            k = min(per_chunk, body["max_tokens"] - sent)
            choice = {"text": "x" * k, "index": 0, "finish_reason": None}
            if per_chunk > 1:
                choice["logprobs"] = {"tokens": ["x"] * k}
            await response.write(sse({"object": "text_completion", "choices": [choice]}))
            sent += k
            if body["prompt"] == "drop" and sent >= 2:
                self.in_flight -= 1
                request.transport.close()
                return False
        return True

    @staticmethod
    def final_chunk(body: dict) -> dict:
        chunk = {"choices": [{"text": "", "index": 0, "finish_reason": "length"}], "timings": TIMINGS}
        if not body.get("no_usage"):
            prompt = body["prompt"]
            chunk["usage"] = {"prompt_tokens": len(prompt) if isinstance(prompt, list) else len(prompt.split()),
                              "completion_tokens": body["max_tokens"]}
        return chunk


def sse(chunk: dict) -> bytes:
    return f"data: {json.dumps(chunk)}\n\n".encode()


@pytest.fixture(scope="module")
def server():
    served = SseServer()
    served.url = served.start()
    yield served
    served.stop()


def requests_of(*prompts, max_tokens: int = 4) -> list[Request]:
    return [Request(f"p{i}", prompt, max_tokens) for i, prompt in enumerate(prompts)]


# --- arrivals -------------------------------------------------------------------------------------

def test_poisson_arrivals_are_seeded_and_have_the_configured_rate():
    """Same seed, same offsets; the rate measured over 2000 arrivals lies in its 95 % interval: the
    last offset is a sum of 2000 exponential gaps, Gamma(2000, 1/rate)."""
    rate, n = 50.0, 2000
    offsets = poisson_arrivals(rate, n, seed=7)
    assert offsets == poisson_arrivals(rate, n, seed=7)
    assert offsets != poisson_arrivals(rate, n, seed=8)
    assert offsets[0] > 0 and all(b > a for a, b in zip(offsets, offsets[1:]))
    low = n / stats.gamma.ppf(0.975, n, scale=1 / rate)
    high = n / stats.gamma.ppf(0.025, n, scale=1 / rate)
    assert low < n / offsets[-1] < high


# --- the client against the server ----------------------------------------------------------------

def test_a_stream_is_recorded_chunk_by_chunk_with_usage_and_timings(server):
    server.reset()
    body = {"ignore_eos": True, "cache_prompt": False, "delay_s": 0.005}
    run = run_point(server.url, [Request("a", "one two three", 5)], concurrency=1, body=body)
    [record] = run.records
    assert record.ok, record.error
    assert len(record.token_s) == 5 and record.token_s == sorted(record.token_s)
    assert record.first_token_s == record.token_s[0] and record.sent_s < record.first_token_s <= record.done_s
    assert (record.output_tokens, record.prompt_tokens, record.server_timings) == (5, 3, TIMINGS)
    assert record.tpot_s == pytest.approx((record.done_s - record.first_token_s) / 4)
    assert len(record.itl_s) == 4 and record.ttft_s == record.first_token_s - record.sent_s
    sent = server.bodies[0]
    assert sent["stream"] is True and sent["temperature"] == 0 and sent["stream_options"] == {"include_usage": True}
    assert sent["ignore_eos"] is True and sent["cache_prompt"] is False and sent["max_tokens"] == 5
    again = PointRun.from_dict(json.loads(json.dumps(run.to_dict())))
    assert again == run and RequestRecord.from_dict(record.to_dict()) == record


def test_multi_token_chunks_and_a_server_without_usage(server):
    """A chunk carrying 3 tokens counts 3 (its logprobs list them); without usage the output is the
    sum over chunks."""
    run = run_point(server.url, [Request("a", [1, 2, 3, 4], 7)], concurrency=1,
                    body={"tokens_per_chunk": 3, "no_usage": True})
    [record] = run.records
    assert record.ok and record.chunk_tokens == [3, 3, 1] and record.output_tokens == 7
    assert record.prompt_tokens == 0 and len(record.token_s) == 3


def test_open_loop_sends_on_schedule_while_responses_are_slow(server):
    """Every request leaves at its offset although each answer takes ~1 s: all are sent before the
    first is done, the server sees all 20 at once, and the client's lag is small beside the gaps."""
    server.reset()
    arrivals = poisson_arrivals(20.0, 20, seed=1)
    run = run_point(server.url, requests_of(*["slow"] * 20, max_tokens=10), arrivals=arrivals,
                    body={"delay_s": 0.1})
    assert all(r.ok for r in run.records), [r.error for r in run.records]
    assert [r.prompt_id for r in run.records] == [f"p{i}" for i in range(20)]
    assert [r.scheduled_s for r in run.records] == arrivals
    assert max(r.sent_s for r in run.records) < min(r.done_s for r in run.records)
    assert server.max_in_flight == 20
    mean_gap = arrivals[-1] / len(arrivals)
    assert statistics.median(r.client_lag_s for r in run.records) < mean_gap / 4
    assert (run.mode, run.concurrency, run.offered_rps) == ("poisson", None, 20 / arrivals[-1])
    summary = summarize(run, Slo(ttft_s=1.0, tpot_s=1.0))
    assert summary["requests"] == 20 and summary["errors"] == 0
    assert summary["client_lag_s_max"] == max(r.client_lag_s for r in run.records)
    assert summary["offered_rps"] == pytest.approx(run.offered_rps)
    assert 0 <= summary["client_cpu_share"] and summary["client_cpu_s"] == run.client_cpu_s


def test_closed_loop_never_exceeds_its_concurrency(server):
    server.reset()
    run = run_point(server.url, requests_of(*["x"] * 12), concurrency=3, body={"delay_s": 0.02})
    assert all(r.ok for r in run.records)
    assert server.max_in_flight == 3
    events = sorted([(r.sent_s, 1) for r in run.records] + [(r.done_s, -1) for r in run.records],
                    key=lambda e: (e[0], e[1]))
    assert max(np.cumsum([step for _, step in events])) == 3
    assert sorted(r.scheduled_s for r in run.records)[:3] == [0.0, 0.0, 0.0]
    assert (run.mode, run.concurrency, run.offered_rps) == ("concurrency", 3, None)
    assert math.isnan(summarize(run, Slo(1.0, 1.0))["offered_rps"])


def test_failures_become_record_errors_and_the_rest_is_kept(server):
    run = run_point(server.url, requests_of("ok", "fail", "drop", "short", "ok"), concurrency=1)
    ok, fail, drop, short, last = run.records
    assert ok.ok and last.ok and ok.output_tokens == last.output_tokens == 4
    assert fail.error == "HTTP 500: boom second line" and fail.token_s == []
    assert drop.error.startswith("connection dropped") and len(drop.token_s) == 2 and drop.output_tokens == 2
    assert short.error == "stream ended before [DONE]" and len(short.token_s) == 4
    assert all("\n" not in r.error for r in run.records)
    timed_out = run_point(server.url, requests_of("ok", max_tokens=3), concurrency=1,
                          body={"delay_s": 0.5}, timeout_s=0.2)
    assert timed_out.records[0].error == "timeout after 0.2 s"


def test_a_server_that_sends_no_done_is_complete_after_its_finish_reason(server):
    """A server that closes each stream after a chunk with a ``finish_reason`` and usage, without
    ``data: [DONE]`` (``ends_with_done=False``): that stream is a whole request; one dropped before
    its finish_reason is still an error."""
    run = run_point(server.url, requests_of("short", "drop", "ok"), concurrency=1, ends_with_done=False)
    short, drop, ok = run.records
    assert short.ok and short.output_tokens == 4 and short.finish_reason == "length"
    assert drop.error.startswith("connection dropped") and drop.finish_reason == ""
    assert ok.ok and ok.finish_reason == "length"


def test_a_server_that_dies_mid_point_leaves_the_records_measured_so_far():
    dying = SseServer()
    url = dying.start()
    try:
        run = run_point(url, requests_of("a", "b", "die", "c", "d", "e"),
                        arrivals=[0.01, 0.05, 0.1, 0.6, 0.65, 30.0])
    finally:
        dying.stop()
    first, after = run.records[:3], run.records[3:]
    assert all(r.ok for r in first) and all(not r.ok for r in after)
    assert any(r.error == "connection refused" for r in after)
    assert run.records[-1].error.startswith("not sent: server unreachable")      # not waited for: 30 s
    assert run.wall_s < 30


def test_a_refused_connection_is_an_error_not_an_exception():
    dead = SseServer()
    url = dead.start()
    dead.stop()
    run = run_point(url, requests_of("a", "b", "c"), concurrency=2)
    assert [r.ok for r in run.records] == [False] * 3
    assert all("connection refused" in r.error for r in run.records)


# --- percentiles ----------------------------------------------------------------------------------

def test_percentiles_are_nearest_rank_and_fall_back_to_the_largest_value():
    assert MIN_FOR == {50: 1, 95: 20, 99: 100}
    p = percentile_with_interval([5, 1, 4, 2, 3], 50)
    assert (p.value, p.n, p.exact) == (3, 5, True) and p.low <= 3 <= p.high
    p = percentile_with_interval([5, 1, 4, 2, 3], 95)
    assert (p.value, p.exact) == (5, False) and math.isnan(p.low) and math.isnan(p.high)
    p = percentile_with_interval(range(1, 21), 95)                 # rank ceil(0.95 * 20) = 19
    assert (p.value, p.exact) == (19, True) and p.low <= 19 <= p.high
    assert percentile_with_interval(range(1, 21), 99).value == 20  # 20 < 100: the largest
    assert percentile_with_interval(range(1, 101), 99).value == 99
    assert percentile_with_interval(range(1, 101), 99, seed=3) == percentile_with_interval(range(1, 101), 99, seed=3)
    assert math.isnan(percentile_with_interval([], 50).value)


def test_the_bootstrap_draws_the_resampled_order_statistic_exactly():
    """The k-th of n values resampled with replacement is at or below the j-th smallest with
    probability P(Binomial(n, j/n) >= k). The drawn bootstrap distribution matches it within the
    Dvoretzky-Kiefer-Wolfowitz band for its resample count (false alarm 1e-6)."""
    n, q, resamples = 30, 90, 20000
    values = np.arange(1.0, n + 1)
    k = math.ceil(q * n / 100)
    u = np.random.default_rng(0).beta(k, n - k + 1, size=resamples)
    drawn = values[np.clip(np.ceil(n * u).astype(int) - 1, 0, n - 1)]
    empirical = np.array([(drawn <= v).mean() for v in values])
    exact = np.array([stats.binom.sf(k - 1, n, j / n) for j in range(1, n + 1)])
    assert np.max(np.abs(empirical - exact)) < math.sqrt(math.log(2 / 1e-6) / (2 * resamples))
    p = percentile_with_interval(values, q, resamples=resamples)
    lo, hi = values[np.searchsorted(exact, 0.025)], values[np.searchsorted(exact, 0.975)]
    assert abs(p.low - lo) <= 1 and abs(p.high - hi) <= 1


# --- summaries on a hand-built trace --------------------------------------------------------------

def built(i: int, sent: float, ttft: float, gap: float, scheduled: float | None = None,
          error: str = "") -> RequestRecord:
    """A record of 5 tokens, ``gap`` s apart, first after ``ttft``; an error record carries none."""
    if error:
        return RequestRecord(f"p{i}", sent if scheduled is None else scheduled, sent_s=sent, done_s=sent + 0.01,
                             error=error)
    tokens = [sent + ttft + j * gap for j in range(5)]
    return RequestRecord(f"p{i}", sent if scheduled is None else scheduled, sent_s=sent, first_token_s=tokens[0],
                         token_s=tokens, chunk_tokens=[1] * 5, done_s=tokens[-1], output_tokens=5)


def trace() -> list[RequestRecord]:
    """5 warm-up requests (sent 0.1-0.5 s, TTFT 10 s), listed last; then 20 requests scheduled every
    0.5 s from 1.0 to 10.5 s: request i (1-19) has TTFT i/100 s and gaps of i/1000 s, request 3
    was sent 0.03 s late, request 20 failed."""
    kept = [built(i, 0.5 + 0.5 * i + (0.03 if i == 3 else 0), i / 100, i / 1000, scheduled=0.5 + 0.5 * i)
            for i in range(1, 20)]
    kept.append(built(20, 10.5, 0, 0, error="HTTP 503: busy"))
    warm = [built(100 + i, 0.1 * i, 10.0, 0.001) for i in range(1, 6)]
    return kept + warm


def test_summary_of_a_known_trace():
    """By hand: 19 ok TTFTs 0.01..0.19 (nearest rank 10 of 19 is 0.10; p95 and p99 over 19 < 20
    requests are the largest, 0.19); 76 pooled gaps, four each of 0.001..0.019 (rank 38 of 76 is
    0.010, rank 73 is 0.019, p99 over 76 < 100 is the largest); TPOT = the gap. The window starts at
    the last warm-up arrival (0.5 s): 20 arrivals to 10.5 s offer 2 rps. Wall: first send 1.0 s to
    the last done 10.51 s. Within TTFT 0.155 s and TPOT 0.0125 s: requests 1-12."""
    summary = summarize(trace(), Slo(ttft_s=0.155, tpot_s=0.0125), warmup=5, client_cpu_s=0.95)
    wall = 10.51 - 1.0
    expected = {
        "requests": 20, "errors": 1, "warmup_requests": 5, "offered_rps": 2.0, "wall_s": wall,
        "achieved_rps": 19 / wall, "output_tok_per_s": 19 * 5 / wall, "goodput_rps": 12 / wall,
        "slo_attainment": 12 / 20, "client_lag_s_max": 0.03, "client_cpu_s": 0.95, "client_cpu_share": 0.95 / wall,
        "ttft_s_p50": 0.10, "ttft_s_p50_exact": 1, "ttft_s_p95": 0.19, "ttft_s_p95_exact": 0,
        "ttft_s_p99": 0.19, "ttft_s_p99_exact": 0,
        "itl_s_p50": 0.010, "itl_s_p50_exact": 1, "itl_s_p95": 0.019, "itl_s_p95_exact": 1,
        "itl_s_p99": 0.019, "itl_s_p99_exact": 0,
        "tpot_s_p50": 0.010, "tpot_s_p95": 0.019, "tpot_s_p95_exact": 0,
        "e2e_s_p50": 0.10 + 4 * 0.010,
        # thirds of 19: the first six TTFTs 0.01-0.06 (median 0.035), the last six 0.14-0.19 (0.165)
        "ttft_s_first_third_p50": 0.035, "ttft_s_last_third_p50": 0.165, "ttft_growth": 0.165 / 0.035,
        # completions: request 1 done at 1.0 + 0.01 + 4 * 0.001, request 19 at 10.0 + 0.19 + 4 * 0.019
        "completion_rps": 18 / ((10.0 + 0.19 + 0.076) - 1.014),
    }
    assert {k: summary[k] for k in expected} == pytest.approx(expected)
    assert summary["ttft_s_p50_low"] <= 0.10 <= summary["ttft_s_p50_high"]
    assert math.isnan(summary["ttft_s_p95_low"]) and summary["itl_s_p95_low"] <= 0.019 <= summary["itl_s_p95_high"]
    assert not keeps_up(summary)                                   # an error, and TTFT grew


def test_without_warmup_the_warmup_requests_count():
    summary = summarize(trace(), Slo(ttft_s=0.15, tpot_s=0.012))
    assert summary["requests"] == 25 and summary["ttft_s_p95"] == 10.0 and summary["ttft_s_p95_exact"] == 1
    assert summary["offered_rps"] == pytest.approx(25 / 10.5)


# --- saturation -----------------------------------------------------------------------------------

def ladder_point(offered: float, completion: float, first: float = 0.05, last: float = 0.06, errors: int = 0,
                 ttft_p95: float = 0.2, tpot_p95: float = 0.02) -> dict[str, float]:
    return {"offered_rps": offered, "completion_rps": completion, "achieved_rps": completion * 0.95,
            "requests": 100.0, "errors": float(errors), "ttft_s_first_third_p50": first,
            "ttft_s_last_third_p50": last, "ttft_s_p95": ttft_p95, "tpot_s_p95": tpot_p95}


def test_keeps_up_rule():
    assert keeps_up(ladder_point(10, 9.0))
    assert not keeps_up(ladder_point(10, 8.9))                      # below 0.9 x offered
    assert not keeps_up(ladder_point(10, 10, errors=1))
    assert keeps_up(ladder_point(10, 10, first=0.005, last=0.055))  # 2 x 0.005 + 0.05 slack
    assert not keeps_up(ladder_point(10, 10, first=0.005, last=0.065))
    assert keeps_up(ladder_point(math.nan, 3.0))                    # closed loop: no offered rate to match
    assert not keeps_up({"requests": 0.0, "errors": 0.0})


def test_saturation_and_the_sustainable_point_on_a_synthetic_ladder():
    slo = Slo(ttft_s=0.5, tpot_s=0.05)
    ladder = [ladder_point(1, 1.0), ladder_point(2, 2.0, ttft_p95=0.3), ladder_point(4, 3.9, ttft_p95=0.7),
              ladder_point(8, 7.8, first=0.1, last=1.5),         # TTFT grows: queueing
              ladder_point(16, 16.0),                            # keeps up by luck above a failure: ignored
              ladder_point(math.nan, 20.0)]                      # a closed-loop point: not on the ladder
    assert saturation_rps(ladder) == 4
    assert saturation_rps(list(reversed(ladder))) == 4
    assert saturation_rps([ladder_point(1, 0.5)]) is None
    # p95 TTFT over the SLO at 4 rps; 16 and the closed-loop point keep up and are within it
    assert sustainable(ladder[:4], slo) is ladder[1]
    assert sustainable(ladder, slo)["achieved_rps"] == pytest.approx(20 * 0.95)
    assert sustainable([ladder_point(1, 1.0, tpot_p95=0.06)], slo) is None


def test_an_open_loop_point_stops_early_once_its_stop_says_why(server):
    """A probe that can no longer pass stops: nothing more is sent, the requests in flight are
    cancelled, and every record left says so (``STOPPED``); the ones that finished are kept."""
    from trials.measurement.load import STOPPED

    server.reset()
    arrivals = [0.05 * i for i in range(1, 41)]          # 40 requests over 2 s, each ~0.5 s long
    run = run_point(server.url, requests_of(*["slow"] * 40, max_tokens=5), arrivals=arrivals,
                    body={"delay_s": 0.1}, stop=lambda finished: "enough" if len(finished) >= 3 else "")
    done = [r for r in run.records if r.ok]
    stopped = [r for r in run.records if r.error.startswith(STOPPED)]
    assert len(done) == 3 and len(done) + len(stopped) == 40
    assert any("cancelled in flight (enough)" in r.error for r in stopped)
    assert any("not sent (enough)" in r.error for r in stopped)
    assert run.wall_s < 1.5                               # not the 2.5 s the whole point takes
