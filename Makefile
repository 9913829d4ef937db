# The README's two commands: `make demo` and `make test`. Both set up .venv first.
VENV ?= .venv
PYTHON ?= python3
PY := $(VENV)/bin/python

.PHONY: install demo test test-fast lint bench clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -e ".[dev,mlflow]"
	touch $@

install: $(VENV)/.installed

demo: install
	$(VENV)/bin/raymtl compare jobs/demo_digits.yaml "algorithm.name=sfmtl_graph,fedu,fedavg" --out runs/demo

test: install
	$(PY) -m pytest -q

test-fast: install
	$(PY) -m pytest -q -m "not ray and not slow"

lint: install
	$(VENV)/bin/ruff check raymtl tests benchmarks examples
	$(VENV)/bin/ruff format --check raymtl tests benchmarks examples

bench: install
	$(PY) benchmarks/overhead.py

clean:
	rm -rf runs .pytest_cache .ruff_cache
