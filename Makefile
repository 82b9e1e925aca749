# The two commands a new user runs: `make demo` and `make test`. Both install what they need.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
DEVSTAMP:= $(VENV)/.installed-dev
DEMO    := .tkg/demo
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export RAY_USAGE_STATS_ENABLED := 0

.PHONY: demo test install install-dev lint bench clean docs report

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# CPU torch first, from the local wheel: otherwise pip resolves torch from PyPI with CUDA.
$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e .
	touch $@

$(DEVSTAMP): $(STAMP)
	$(BIN)/pip install -q -e '.[dev]'
	touch $@

install: $(STAMP)
install-dev: $(DEVSTAMP)

demo: $(STAMP)
	$(BIN)/tkg build --config configs/local.yaml --input tests/corpus --store $(DEMO)

test: $(DEVSTAMP)
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q

lint: $(DEVSTAMP)
	$(BIN)/ruff check .

bench: $(STAMP)
	$(BIN)/tkg bench build --episodes 20000

# Generated docs: the config reference and the notebooks (tests fail when they are stale).
docs: $(DEVSTAMP)
	$(BIN)/tkg docs config
	$(BIN)/python notebooks/make_notebooks.py

# One HTML page about the demo store (after `make demo`).
report: $(STAMP)
	$(BIN)/tkg report --store $(DEMO) --out $(DEMO)/report.html

clean:
	rm -rf $(VENV) .tkg
