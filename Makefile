# Two entry points: `make demo` and `make test`. Both create .venv with the pinned versions first.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cat requirements/base.txt requirements/dev.txt requirements/p2p.txt pyproject.toml | sha1sum | cut -c1-12)

.PHONY: demo test lint venv vllm-env clean

venv: $(STAMP)

$(STAMP): requirements/base.txt requirements/dev.txt requirements/p2p.txt pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -r requirements/dev.txt
	$(BIN)/python -m pip install -q --no-deps -r requirements/p2p.txt
	$(BIN)/python -m pip install -q --no-deps --no-build-isolation -e .
	rm -f $(VENV)/.installed-*
	touch $@

# `ec-connector demo`: one real vLLM engine reloading repeated images from the CPU tier, then two
# real vLLM servers on loopback: an encoder-only producer and a consumer that pulls the producer's
# encodings over NIXL (examples/). `ec-connector demo --synthetic` runs the local tier without vLLM.
demo: $(STAMP) vllm-env
	$(BIN)/ec-connector demo

# The real-engine tests need vLLM's CPU build in its own venv (.venv-vllm, ~3.6 GB, ~5 min once).
# vLLM 0.33's scheduler side runs over it from .venv-vllm033 (its CUDA wheel's Python tree, 122 MB,
# ~20 s once): tests/integration/test_vllm033_facade.py checks the facade against both versions.
vllm-env: $(STAMP)
	tools/setup_vllm_env.sh
	tools/setup_vllm033_overlay.sh

# Two workers, one test file each at a time (a file's engines and module fixtures stay together):
# most of the time goes to real engines starting and to bounded waits, which overlap well on 2 cores.
test: $(STAMP) vllm-env
	$(BIN)/python -m pytest -n 2 --dist loadfile

lint: $(STAMP)
	$(BIN)/ruff check ec_connector tests bench
	$(BIN)/lint-imports
	$(BIN)/python -m mypy

clean:
	rm -rf $(VENV) .venv-vllm .venv-vllm033 .pytest_cache .hypothesis build *.egg-info
