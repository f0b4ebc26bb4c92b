# Quick start: `make demo`, `make test`. Both create .venv on first use.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
BUCKET ?= .arrayjob/bucket
DEMO   := $(BUCKET)/demo/logreg

.PHONY: demo test lint clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e .
	touch $@

$(VENV)/.installed-test: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e ".[test]"
	touch $@ $(VENV)/.installed

$(DEMO)/X.zarr/zarr.json: | $(VENV)/.installed
	$(BIN)/arrayjob datagen logreg $(DEMO) --rows 200000 --cols 32 --chunk-rows 25000 --seed 0

demo: $(VENV)/.installed $(DEMO)/X.zarr/zarr.json
	$(BIN)/arrayjob run configs/logreg.toml

test: $(VENV)/.installed-test
	$(BIN)/python -m pytest

lint: $(VENV)/.installed-test
	$(BIN)/ruff check .

clean:
	rm -rf $(VENV) .arrayjob
