# Quick start: `make demo`, `make test`. Both create .venv on first use.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
BUCKET ?= .arrayjob/bucket
DEMO   := $(BUCKET)/demo/logreg

.PHONY: demo test test-airflow bench lint clean

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

# Import contracts first (layers downward only, no cycles, a planner free of execution
# and storage libraries: [tool.importlinter] in pyproject.toml), then the suite.
test: $(VENV)/.installed-test
	$(BIN)/lint-imports --no-cache
	$(BIN)/python -m pytest

# The Airflow DAG in deploy/airflow run for real with dag.test(), against a loopback S3 server
# and a Ray head with its job server, all inside their own PID and network namespace (needs
# root, unshare and ip). Airflow is too heavy for .venv: it gets its own virtualenv.
AIRFLOW_VENV    ?= .venv-airflow
AIRFLOW_VERSION ?= 3.3.2
$(AIRFLOW_VENV)/.installed:
	$(PYTHON) -m venv $(AIRFLOW_VENV)
	$(AIRFLOW_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(AIRFLOW_VENV)/bin/python -m pip install --quiet "apache-airflow==$(AIRFLOW_VERSION)"
	touch $@

test-airflow: $(VENV)/.installed-test $(AIRFLOW_VENV)/.installed
	unshare --pid --fork --mount-proc --net bash -c \
		'ip link set lo up && exec $(BIN)/python tests/airflow_dag.py --airflow $(AIRFLOW_VENV)/bin'

# arrayjob against its peers and the machine's limits (docs/benchmarks.md). The full size
# takes about 10 minutes on 2 cores; `make bench BENCH_SIZE=quick` a few.
BENCH_SIZE ?= full
BENCH_ARGS ?=
bench: $(VENV)/.installed-bench
	$(BIN)/python benchmarks/bench.py --size $(BENCH_SIZE) --json .arrayjob/bench/bench-$(BENCH_SIZE).json \
		--markdown .arrayjob/bench/bench-$(BENCH_SIZE).md $(BENCH_ARGS)

lint: $(VENV)/.installed-test
	$(BIN)/ruff check .

clean:
	rm -rf $(VENV) $(AIRFLOW_VENV) .arrayjob
