# Two commands on a fresh machine: `make demo` (the main job on the embedded SQLite store)
# and `make test`. Both create .venv and install the project on first use.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: demo test lint bench clean zenml-demo

# uv installs what pip would (the same resolution), in a third of pip's time: 38 -> 13 s here,
# 55 -> 16 s for the ZenML venv (2026-11-27). Bytecode is compiled at install, as pip does: CI's
# machine sets PYTHONDONTWRITEBYTECODE, so modules not compiled then are compiled by every process.
$(BIN)/fairpool: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet uv
	$(BIN)/uv pip install --quiet --python $(BIN)/python --compile-bytecode -e '.[test]'
	touch $@

demo: $(BIN)/fairpool
	PATH="$(CURDIR)/$(BIN):$$PATH" bash examples/tour.sh

# pytest on two workers (pytest-xdist): 4.4 -> 2.9 min on a 2-core machine, 2026-11-24. Three
# were faster on a slow night (8.3 -> 7.1 min) and passed CI once; two have passed it longest.
# Work stealing, with the tests marked long started first (tests/conftest.py), so that the run
# does not end with one worker alone on a minute-long test.
# The package is compiled first: where PYTHONDONTWRITEBYTECODE is set (CI's machine), every
# CLI and server subprocess would compile fairpool's modules again. The ZenML stage's venv and
# type check are made meanwhile, in the background (35 s of its 4 min, 2026-11-30: CI's whole
# run had come within a minute of its 15).
test: $(BIN)/fairpool
	$(BIN)/ruff check fairpool tests benchmarks examples
	$(BIN)/mypy
	$(BIN)/python -m compileall -q fairpool tests
	bash tests/zenml/prepare.sh > .zenml-prepare.log 2>&1 & prepared=$$!; \
	$(BIN)/python -m pytest -q -n 2 --dist worksteal; tested=$$?; \
	wait $$prepared || { cat .zenml-prepare.log; echo "tests/zenml/prepare.sh failed"; exit 1; }; \
	cat .zenml-prepare.log; test $$tested -eq 0
	ZENML_PREPARED=1 bash tests/zenml/run.sh

# A real ZenML dynamic pipeline queued and granted by fairpool, behind a local ZenML server
# (127.0.0.1, throw-away config); the ZenML venv (.zenml-venv, or ZENML_VENV) is made on first use.
zenml-demo:
	bash examples/zenml/run.sh

bench: $(BIN)/fairpool
	$(BIN)/python benchmarks/engine.py

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache .hypothesis
