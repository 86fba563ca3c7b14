"""The toy server: one HF folder behind an OpenAI-style ``/v1/completions`` on 127.0.0.1, one request at
a time, greedy, exactly ``max_tokens`` tokens (the toy engine's loop: ``toy_engine.backend.greedy``),
streamed as server-sent events ending with ``data: [DONE]``; ``/health`` answers 200 once loaded.
Python's own ``http.server``: the smallest server that is still a real one.

    python -m toy_server.server --model FOLDER --port 8000 [--threads N]
"""

from __future__ import annotations

import argparse
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

HOST = "127.0.0.1"


def serve(model_folder: str, port: int, threads: int) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from toy_engine.backend import greedy

    torch.set_num_threads(threads)
    model = AutoModelForCausalLM.from_pretrained(model_folder, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(model_folder)
    one_at_a_time = threading.Lock()
    served = {"requests": 0, "tokens": 0}

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:            # no line per request in the server's log
            pass

        def answer(self, status: int, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            if self.path == "/health":
                self.answer(200, {"status": "ok"})
            elif self.path == "/metrics.json":
                self.answer(200, dict(served))
            else:
                self.answer(404, {"error": f"no {self.path}"})

        def do_POST(self) -> None:
            if self.path != "/v1/completions":
                return self.answer(404, {"error": f"no {self.path}"})
            request = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
            prompt = request["prompt"]
            ids = prompt if isinstance(prompt, list) else tokenizer(prompt)["input_ids"]
            new = int(request.get("max_tokens", 16))
            if not request.get("stream"):
                with one_at_a_time:
                    out = list(greedy(model, torch.tensor([ids]), new))
                served["requests"] += 1
                served["tokens"] += len(out)
                return self.answer(200, {"choices": [{"text": tokenizer.decode(out, skip_special_tokens=True),
                                                      "tokens": out, "finish_reason": "length"}],
                                         "usage": {"prompt_tokens": len(ids), "completion_tokens": len(out)}})
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()

            def event(body) -> None:
                self.wfile.write(f"data: {body if isinstance(body, str) else json.dumps(body)}\n\n".encode())
                self.wfile.flush()

            count = 0
            with one_at_a_time:
                for token in greedy(model, torch.tensor([ids]), new):
                    count += 1
                    event({"choices": [{"index": 0, "text": tokenizer.decode([token]), "tokens": [token],
                                        "finish_reason": None}]})
            served["requests"] += 1
            served["tokens"] += count
            event({"choices": [{"index": 0, "text": "", "finish_reason": "length"}],
                   "usage": {"prompt_tokens": len(ids), "completion_tokens": count}})
            event("[DONE]")

    ThreadingHTTPServer((HOST, port), Handler).serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m toy_server.server", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="the HF folder to serve")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    serve(args.model, args.port, args.threads)


if __name__ == "__main__":
    main()
