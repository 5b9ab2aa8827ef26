# One command each: `make run` (set up, fetch the pinned SGLang, apply the recipes) and
# `make test` (set up, run the whole test suite; GPU tests skip without a GPU).
# `make lint` runs ruff (lint + format check) as CI does.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
# Where pip finds torch for the CPU tests; e.g. https://download.pytorch.org/whl/cpu for the
# CPU-only build (PyPI's Linux wheel is the CUDA one, with its CUDA libraries).
TORCH_INDEX_URL ?=
# No byte-compiling at install: Python compiles a module when it is first imported, and the
# tests import a small part of torch, whose compile is otherwise most of the setup's time.
PIP_INSTALL := $(BIN)/pip install -q --no-compile

$(BIN)/spectool: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(PIP_INSTALL) -e '.[test]'
	@touch $@

# CPU extras for the tests that build golden models and plot bench results.
$(VENV)/.test-extras: $(BIN)/spectool
	$(PIP_INSTALL) torch==2.13.0 $(if $(TORCH_INDEX_URL),--index-url $(TORCH_INDEX_URL))
	$(PIP_INSTALL) safetensors matplotlib
	@touch $@

.PHONY: run test lint clean
run: $(BIN)/spectool
	$(BIN)/spectool apply

# pytest fetches the SGLang releases it needs first, a line each (tests/conftest.py), and runs
# the tests on every core (pytest-xdist). Its exit
# code 5 (no tests collected) is reported as such, not as a failure.
test: $(VENV)/.test-extras
	$(BIN)/python -m pytest -n auto; rc=$$?; if [ $$rc -eq 5 ]; then echo "no tests collected"; rc=0; fi; exit $$rc

lint: $(BIN)/spectool
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

clean:
	rm -rf $(VENV) build
