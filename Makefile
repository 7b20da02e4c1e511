# `make demo` and `make test` set themselves up from nothing (a .venv installed from the
# registries) and are idempotent: the install reruns only when pyproject.toml changes.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: setup demo test bench mutants clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test,spark]'
	touch $(STAMP)

demo: $(STAMP)
	.venv/bin/dprelease demo

test: $(STAMP)
	$(PY) -m pytest -n 3 -q --durations=15

bench: $(STAMP)
	$(PY) bench/engine.py

# mutation testing (docs/testing.md), not part of `make test`: all critical modules by default, or
# FILES="dp_core/noise.py ..." or CHANGED=main (the critical modules changed since main); JOBS workers;
# SAMPLE=30 SEED=20261124: only a uniform random sample of SAMPLE mutants per module, drawn with SEED
# SAMPLE_FOR="dprelease/=8": another sample size for the modules under a path prefix
JOBS ?= 1
SEED ?= 20261124
mutants: $(VENV)/.installed-mutants
	$(PY) tools/mutants.py --max-children $(JOBS) $(if $(FILES),--files $(FILES)) $(if $(CHANGED),--changed $(CHANGED)) \
		$(if $(SAMPLE),--sample $(SAMPLE) --seed $(SEED)) $(if $(SAMPLE_FOR),--sample-for $(SAMPLE_FOR))

$(VENV)/.installed-mutants: $(STAMP)
	$(PY) -m pip install --quiet -e '.[test,mutants]'
	touch $@

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache mutants
