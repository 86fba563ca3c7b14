#!/usr/bin/env bash
# The GPU check with the repo's python (.venv) when there is one, else python3; arguments pass through.
root="$(cd "$(dirname "$0")/.." && pwd)"; py="$root/.venv/bin/python"; [ -x "$py" ] || py=python3
cd "$root" && exec "$py" -m benchmarks.gpu_check "$@"
