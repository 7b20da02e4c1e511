# `make demo` and `make test` set themselves up from nothing (a .venv installed from the
# registries) and are idempotent: the install reruns only when pyproject.toml changes.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: setup demo test bench clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test,spark]'
	touch $(STAMP)

demo: $(STAMP)
	.venv/bin/dprelease demo

test: $(STAMP)
	$(PY) -m pytest -n 2 -q

bench: $(STAMP)
	$(PY) bench/engine.py

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
