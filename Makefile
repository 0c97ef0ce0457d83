# kvtrace: `make demo` and `make test` install everything they need on a fresh machine.
PYTHON ?= python3.11
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
DEMO   ?= demo-run

.PHONY: install demo test test-all lint bench browser vllm-engine docs clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev,ray]'
	KVTRACE=$(VENV)/bin/kvtrace bash scripts/compile_kernels.sh
	touch $(STAMP)

install: $(STAMP)

# Debian's Chromium and ChromeDriver, for the browser test of the HTML report and the demo's screenshot.
browser:
	@command -v chromium >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends chromium chromium-driver fonts-liberation; \
	  else echo "chromium missing: run 'sudo apt-get install --no-install-recommends chromium chromium-driver fonts-liberation'"; fi; }

# The real CPU vLLM engine (its own virtual environment in the kvtrace cache folder).
vllm-engine: $(STAMP)
	$(VENV)/bin/kvtrace engine install

demo: $(STAMP) browser vllm-engine
	bash scripts/demo.sh $(DEMO)

# Two workers, one per core (tests/lanes.py: a module's tests, the real-engine tests, the Ray tests stay together).
PYTEST_WORKERS ?= -n 2 --dist loadgroup

# The fast lane: every test but those marked `full` (the slowest real-engine cases), fewer property examples.
test: $(STAMP) browser vllm-engine
	$(PY) -m pytest -q $(PYTEST_WORKERS) -m "not full" --hypothesis-profile kvtrace-fast $(PYTEST_ARGS)

# Every test, every example: what CI runs (.ci/run).
test-all: $(STAMP) browser vllm-engine
	$(PY) -m pytest -q $(PYTEST_WORKERS) $(PYTEST_ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check tongyi_trace tests bench
	$(VENV)/bin/mypy tongyi_trace

# docs/cli.md's command reference, from the commands' --help (tests/docs/test_cli_docs.py checks it is current).
docs: $(STAMP)
	$(PY) scripts/gen_cli_docs.py

bench: $(STAMP) browser vllm-engine
	@for f in bench/bench_*.py; do echo "== $$f"; $(PY) $$f || exit 1; done

clean:
	rm -rf $(VENV) $(DEMO) .pytest_cache .mypy_cache .ruff_cache
