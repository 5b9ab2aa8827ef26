# One command each: `make run` (set up, fetch the pinned SGLang, apply the recipes) and
# `make test` (set up, run the whole test suite; GPU tests skip without a GPU).
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin

$(BIN)/spectool: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test]'
	@touch $@

# CPU extras for the tests that build golden models and plot bench results.
$(VENV)/.test-extras: $(BIN)/spectool
	$(BIN)/pip install -q torch==2.13.0 safetensors matplotlib
	@touch $@

.PHONY: run test clean
run: $(BIN)/spectool
	$(BIN)/spectool apply

test: $(VENV)/.test-extras
	$(BIN)/python -m pytest; rc=$$?; if [ $$rc -eq 5 ]; then echo "no tests collected"; rc=0; fi; exit $$rc

clean:
	rm -rf $(VENV) build
