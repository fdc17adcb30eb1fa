# Everything a fresh machine with only Python needs: `make demo`, `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
DEMO   := $(VENV)/.demo
DOCS   := $(VENV)/.docs
# torch and torchvision as a lent GPU runs them, for make test-compat.
COMPAT        := .venv-compat
COMPAT_STAMP  := $(COMPAT)/.installed
COMPAT_PYTHON ?= $(PYTHON)
COMPAT_TORCH  ?= 2.11.*
COMPAT_VISION ?= 0.26.*

.PHONY: demo test test-fast test-compat notebooks fuzz lint format typecheck docs verifytypes bench gpu-check install clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

# What make test needs: the package with every extra (frameworks, notebooks, lint), and the doc tools.
$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -e ".[test,bench,notebooks,integrations,ray]" --group docs
	touch $(STAMP)

# What make demo needs, and no more: the package, torchvision, matplotlib and tqdm.
$(DEMO): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -e ".[demo]"
	touch $(DEMO)

# What make docs needs: the doc tools alone (the docs dependency group, not the package:
# mkdocstrings reads the package's source beside mkdocs.yml).
$(DOCS): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q --group docs
	touch $(DOCS)

install: $(STAMP)

$(COMPAT)/bin/python:
	$(COMPAT_PYTHON) -m venv $(COMPAT)
	$(COMPAT)/bin/python -m pip install -q --upgrade pip

# The packages make test installs, with the device's torch and torchvision.
$(COMPAT_STAMP): pyproject.toml | $(COMPAT)/bin/python
	$(COMPAT)/bin/python -m pip install -q -e ".[test,bench,notebooks,integrations,ray]" "torch==$(COMPAT_TORCH)" "torchvision==$(COMPAT_VISION)"
	touch $(COMPAT_STAMP)

## Quick benchmark on built-in synthetic data: prints a table, writes bench.json and bench.png.
demo: $(DEMO)
	$(BIN)/python -m pincollate.bench --quick --json bench.json --plot bench.png

## The whole suite: unit, parity, property, DataLoader worker, fault, framework and notebook tests.
test: $(STAMP)
	$(BIN)/python -m pytest

## The quick loop: everything but the multi-process tests (workers, torchrun, notebooks), about a minute on 2 cores.
test-fast: $(STAMP)
	$(BIN)/python -m pytest -m "not slow" -q -p no:cacheprovider

## The CPU suite under torch 2.11 and torchvision 0.26 (a lent GPU's release) in .venv-compat, so an API
## that release lacks shows up here, not on the device. The first run downloads a few GB.
test-compat: $(COMPAT_STAMP)
	$(COMPAT)/bin/python -m pytest -p no:cacheprovider

## Run the notebooks whose code changed, in place, and keep their outputs (as committed); FORCE=1 runs all three.
## Uses what make test installs.
notebooks: $(STAMP)
	$(BIN)/python notebooks/run.py $(if $(FORCE),--force)

## The lifetime fuzzer's long run (about 10 minutes on 2 cores); SEED=n picks another program.
SEED ?= 0
fuzz: $(STAMP)
	$(BIN)/python tests/lifetime.py --steps 100000 --seed $(SEED)

## ruff's lint rules and formatting, checked (make format applies them).
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: $(STAMP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

## mypy --strict over the package (settings in pyproject.toml).
typecheck: $(STAMP)
	$(BIN)/mypy

## pyright's type completeness of the public API, on an installed copy (fetches pyright from PyPI and npm).
verifytypes: $(STAMP)
	$(BIN)/python -m pip install -q pyright
	rm -rf build/verifytypes && $(BIN)/python -m pip install -q --no-deps --no-build-isolation --target build/verifytypes .
	cd build && PYTHONPATH=$(CURDIR)/build/verifytypes $(CURDIR)/$(BIN)/pyright --pythonpath $(CURDIR)/$(BIN)/python --verifytypes pincollate --ignoreexternal

## The guide and the API reference (from the docstrings) as a site in site/; any warning fails the build.
## Material's notice about its own end of life is no build warning: it is kept out of the log.
docs: $(DOCS)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

## The full benchmark (all scenarios, longer runs).
bench: $(STAMP)
	$(BIN)/python -m pincollate.bench --json bench.json --plot bench.png

## On a machine with a CUDA GPU: the cuda tests plus the GPU benchmark rows, report in gpu-check.json.
## A thin wrapper: `python3 tests/gpu_check.py` is the same (it needs only torch, numpy and pytest).
GPU_CHECK_JSON ?= gpu-check.json
gpu-check:
	$(PYTHON) tests/gpu_check.py --out $(GPU_CHECK_JSON)

clean:
	rm -rf $(VENV) $(COMPAT) build site bench.json bench.png gpu-check.json .pytest_cache
