# Ember: `make train` trains on-device (simulated board), `make test` runs the test suite.
# Each target creates .venv on first use and installs the project into it.

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.ember-installed
ARGS   ?=
PYTEST_ARGS ?=

.PHONY: help train test bench clean distclean

help:
	@echo "make train   train 64-32-10 on digits with E2-Train settings, report energy"
	@echo "make test    run the test suite"
	@echo "make bench   run the benchmarks (build/bench/)"

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[test]'
	@touch $(STAMP)

train: $(STAMP)
	$(BIN)/ember train --backend sim --preset e2train --reference $(ARGS)

test: $(STAMP)
	$(BIN)/python -m pytest -n 2 $(PYTEST_ARGS)

bench: $(STAMP)
	$(BIN)/python -m ember.bench $(ARGS)

clean:
	rm -rf build .pytest_cache sim_build

distclean: clean
	rm -rf $(VENV) *.egg-info host/*.egg-info
