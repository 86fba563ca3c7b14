"""A streaming ``/v1/completions`` server whose capacity under a TTFT limit is known in closed form
(tests/test_capacity.py starts it in its own process: its own interpreter, so the client's event loop
and this one do not share a GIL).

Every request lasts ``D`` seconds from its arrival, whatever happens: a first chunk, a second chunk
with ``finish_reason`` and usage at ``D``, then ``data: [DONE]``. Its first chunk comes at once when
fewer than ``K`` other requests are in flight at its arrival, else after ``T_MISS`` (< ``D``): slow
first tokens do not lengthen a request, so the load never feeds back on itself. "In flight" is counted
from this server's own clock, as the requests that arrived within the last ``D`` seconds (each lasts
exactly that long), so a late wake-up of this loop cannot change the count. Under Poisson arrivals at
rate ``lam`` that count is Poisson(lam * D) (M/D/inf, PASTA).

    python tests/knee_server.py K D T_MISS

prints ``port <n>`` (127.0.0.1, a free port) once listening, then serves until SIGTERM or SIGINT.
"""

from __future__ import annotations

import asyncio
import collections
import json
import signal
import sys

from aiohttp import web


def sse(chunk: dict) -> bytes:
    return f"data: {json.dumps(chunk)}\n\n".encode()


def app(k: int, d: float, t_miss: float) -> web.Application:
    arrived: collections.deque[float] = collections.deque()     # arrival times within the last d seconds

    async def completions(request: web.Request) -> web.StreamResponse:
        loop = asyncio.get_running_loop()
        now = loop.time()
        while arrived and arrived[0] <= now - d:
            arrived.popleft()
        first_at = now + (t_miss if len(arrived) >= k else 0.0)
        arrived.append(now)
        await request.read()
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await asyncio.sleep(max(first_at - loop.time(), 0.0))
        await response.write(sse({"object": "text_completion",
                                  "choices": [{"text": "a", "index": 0, "finish_reason": None}]}))
        await asyncio.sleep(max(now + d - loop.time(), 0.0))
        await response.write(sse({"object": "text_completion",
                                  "choices": [{"text": "b", "index": 0, "finish_reason": "length"}],
                                  "usage": {"prompt_tokens": 1, "completion_tokens": 2}}))
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    served = web.Application()
    served.router.add_post("/v1/completions", completions)
    return served


async def main(k: int, d: float, t_miss: float) -> None:
    runner = web.AppRunner(app(k, d, t_miss), access_log=None, shutdown_timeout=1)
    await runner.setup()
    # backlog: an open loop at ~300 req/s opens a connection per request
    await web.TCPSite(runner, "127.0.0.1", 0, backlog=1024).start()
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(signum, stop.set)
    print(f"port {runner.addresses[0][1]}", flush=True)
    await stop.wait()
    await runner.cleanup()


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])))
