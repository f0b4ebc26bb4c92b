# Quick start: `make demo`, `make test`. Both create .venv on first use.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
BUCKET ?= .arrayjob/bucket
DEMO   := $(BUCKET)/demo/logreg

.PHONY: demo test test-autoscale bench lint clean check-report

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e .
	touch $@

$(VENV)/.installed-test: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e ".[test]"
	touch $@ $(VENV)/.installed

$(VENV)/.installed-bench: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e ".[bench]"
	touch $@ $(VENV)/.installed

$(DEMO)/X.zarr/zarr.json: | $(VENV)/.installed
	$(BIN)/arrayjob datagen logreg $(DEMO) --rows 200000 --cols 32 --chunk-rows 25000 --seed 0

demo: $(VENV)/.installed $(DEMO)/X.zarr/zarr.json
	$(BIN)/arrayjob run configs/logreg.toml
	@echo "arrayjob is installed in .venv: '. .venv/bin/activate' puts it on PATH (or call .venv/bin/arrayjob)"

# Import contracts first (layers downward only, no cycles, a planner free of execution
# and storage libraries: [tool.importlinter] in pyproject.toml), then the suite.
# The fake autoscaling cluster's tests (tests/autoscale) run last, in their own pytest
# process inside a private PID, mount and network namespace: starting and stopping that
# cluster acts on every Ray process it can see. Needs root (or unprivileged user namespaces).
test: $(VENV)/.installed-test
	$(BIN)/lint-imports --no-cache
	$(BIN)/python -m pytest
	unshare --pid --fork --mount-proc --net sh tests/autoscale/run.sh

test-autoscale: $(VENV)/.installed-test
	unshare --pid --fork --mount-proc --net sh tests/autoscale/run.sh

# arrayjob against its peers and the machine's limits (docs/benchmarks.md). The full size
# takes about 10 minutes on 2 cores; `make bench BENCH_SIZE=quick` a few.
BENCH_SIZE ?= full
BENCH_ARGS ?=
bench: $(VENV)/.installed-bench
	$(BIN)/python benchmarks/bench.py --size $(BENCH_SIZE) --json .arrayjob/bench/bench-$(BENCH_SIZE).json \
		--markdown .arrayjob/bench/bench-$(BENCH_SIZE).md $(BENCH_ARGS)
	$(BIN)/python benchmarks/outofcore.py --size $(BENCH_SIZE) --json .arrayjob/bench/outofcore-$(BENCH_SIZE).json \
		--markdown .arrayjob/bench/outofcore-$(BENCH_SIZE).md

# report.html as a person sees it: the demo's published report rendered by headless Chromium
# (Debian's package, installed if missing; the page runs no JavaScript), saved as a PNG.
REPORT_PNG ?= .arrayjob/report.png
REPORT_SIZE ?= 900,2400
check-report: demo
	command -v chromium >/dev/null || apt-get install -y chromium
	page="$$($(BIN)/python -c 'import json, os, sys; out = sys.argv[1]; \
	  prefix = json.load(open(os.path.join(out, "_SUCCESS")))["prefix"]; \
	  print(os.path.abspath(os.path.join(out, prefix, "report.html")))' $(BUCKET)/results/logreg-demo)"; \
	profile="$$(mktemp -d)"; \
	chromium --headless --no-sandbox --disable-gpu --disable-background-networking --disable-component-update \
	  --disable-sync --no-first-run --user-data-dir="$$profile" --hide-scrollbars \
	  --screenshot="$(abspath $(REPORT_PNG))" --window-size=$(REPORT_SIZE) "file://$$page" 2>/dev/null; \
	status=$$?; rm -rf "$$profile"; test $$status -eq 0 && test -s $(REPORT_PNG) && echo "rendered $$page -> $(REPORT_PNG)"

lint: $(VENV)/.installed-test
	$(BIN)/ruff check .

clean:
	rm -rf $(VENV) .arrayjob
