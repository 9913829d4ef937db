# The README's commands: `make demo`, `make test` (the inner loop, <= 10 minutes on 2 cores)
# and `make test-all` (with the cluster scenarios; what CI runs). All set up .venv first.
VENV ?= .venv
PYTHON ?= python3
PY := $(VENV)/bin/python

.PHONY: install demo test test-all test-fast lint bench clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -e ".[dev,mlflow,hf]"
	touch $@

install: $(VENV)/.installed

demo: install
	$(VENV)/bin/raymtl compare jobs/demo_digits.yaml "algorithm.name=sfmtl_graph,fedu,fedavg" --out runs/demo

# Two pytest-xdist workers: one runs every test that uses Ray (tests/conftest.py groups them),
# the other the tests that need none.
# ARGS: more pytest options, e.g. make test ARGS=--durations=25
XDIST := -n 2 --dist loadgroup

test: install
	$(PY) -m pytest -q $(XDIST) -m "not cluster" $(ARGS)

test-all: install
	$(PY) -m pytest -q $(XDIST) $(ARGS)

test-fast: install
	$(PY) -m pytest -q -m "not ray and not slow and not cluster"

lint: install
	$(VENV)/bin/ruff check raymtl tests benchmarks examples
	$(VENV)/bin/ruff format --check raymtl tests benchmarks examples
	$(VENV)/bin/lint-imports --no-cache

bench: install
	$(PY) benchmarks/overhead.py

clean:
	rm -rf runs .pytest_cache .ruff_cache

# benchmarks/gpu_check.py: with this venv where it has Ray; else (a lent GPU machine: its
# python3 has torch but no Ray, and no network) the wheels of benchmarks/gpu_wheels.py,
# carried in .whl/, go to /tmp/site first. The report goes to $(OUT) when it is set (the
# device's output folder).
GPU_CHECK_OUT ?= $(or $(OUT),runs/gpu-check)
.PHONY: gpu-check
gpu-check:
	@if [ -x $(PY) ] && $(PY) -c "import ray" 2>/dev/null; then \
		$(PY) benchmarks/gpu_check.py --out $(GPU_CHECK_OUT) $(ARGS); \
	elif [ -d .whl ] && ! python3 -c "import ray" 2>/dev/null; then \
		python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
			--target /tmp/site .whl/*.whl && \
		PYTHONPATH=/tmp/site:. python3 benchmarks/gpu_check.py --out $(GPU_CHECK_OUT) $(ARGS); \
	else \
		python3 benchmarks/gpu_check.py --out $(GPU_CHECK_OUT) $(ARGS); \
	fi
