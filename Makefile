# The two set-up commands of the README: `make run` and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
TEST_STAMP := $(VENV)/.installed-test
MODEL ?= sample_models/attn-only-2l

.PHONY: run test lint bench clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# The CPU build of torch goes in first, so the project's loose `torch>=2.2`
# is already satisfied and pip never resolves a multi-GB CUDA wheel.
$(VENV)/.torch: | $(BIN)/python
	$(BIN)/pip install -q "torch==2.13.0" || $(BIN)/pip install -q torch
	touch $@

$(STAMP): pyproject.toml $(VENV)/.torch
	$(BIN)/pip install -q -e .
	touch $@

$(TEST_STAMP): pyproject.toml $(STAMP)
	$(BIN)/pip install -q -e ".[test]"
	touch $@

run: $(STAMP)
	$(BIN)/headscope $(MODEL)

# Two workers that steal tests from each other (balanced to the end), BLAS and OpenMP on one
# thread each: two workers on two cores, no spinning threads fighting over them. Measured with
# two CPU-bound processes beside it: 9m31 (two threads per worker, whole files: 9m53).
# Plain `pytest` runs the same suite in one process.
test: $(TEST_STAMP)
	OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1 \
		$(BIN)/python -m pytest -q -p no:cacheprovider -n 2 --dist worksteal

lint: $(TEST_STAMP)
	$(BIN)/ruff check .

$(VENV)/.installed-bench: pyproject.toml $(TEST_STAMP)
	$(BIN)/pip install -q -e ".[test,bench]"
	touch $@

bench: $(VENV)/.installed-bench
	$(BIN)/python -m bench

clean:
	rm -rf $(VENV)
