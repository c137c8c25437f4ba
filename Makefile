# Two set-up commands on a fresh machine: `make demo` and `make test`. Each installs what it needs.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test unit lint e2e bench proto clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

demo: $(STAMP)
	$(PY) hack/demo

test: lint unit e2e

lint: $(STAMP)
	$(VENV)/bin/ruff check dra_driver tests benchmarks hack/*.py
	$(VENV)/bin/ruff format --check dra_driver tests benchmarks hack/*.py
	$(VENV)/bin/mypy

unit: $(STAMP)
	$(PY) -m pytest -m 'not e2e and not gpu' -q

e2e: $(STAMP)
	hack/build-k8s
	$(PY) -m pytest -m e2e -q

bench: $(STAMP)
	$(PY) benchmarks/bench_prepare.py

proto: $(STAMP)
	hack/gen-proto

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
