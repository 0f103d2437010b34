# Two entry points that work on a fresh machine: `make run` and `make test`.
PY ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin

.PHONY: run test lint bench clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip 'setuptools>=77' wheel

$(VENV)/.core: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e .
	touch $@

# Tests run the real workers, profilers and engines: torch (the CPU wheel 2.13.0 on
# this project's machines; installed first so nothing pulls a CUDA build), jax, ray,
# and DeepSpeed built against that torch (no build isolation, no compiled ops).
$(VENV)/.dev: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[dev,jax,ray]'
	DS_BUILD_OPS=0 $(BIN)/pip install -q --no-build-isolation 'deepspeed>=0.14'
	touch $@ $(VENV)/.core

run: $(VENV)/.core
	$(BIN)/apportion solve-round

test: $(VENV)/.dev
	$(BIN)/python -m pytest -q -p no:cacheprovider

lint: $(VENV)/.dev
	$(BIN)/ruff check apportion formulations solvers estimation runtime experiments tests

bench: $(VENV)/.core
	$(BIN)/apportion bench solve

clean:
	rm -rf $(VENV) build *.egg-info
