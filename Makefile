# Ember: `make train` trains on-device (simulated board), `make test` runs the test suite.
# Each target creates .venv on first use and installs the project into it.

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.ember-installed
# the test and fleet extras (pytest, Ray) on top: make test and make bench need them, make
# train does not, and a fresh clone's make train does not wait for them
TEST_STAMP := $(VENV)/.ember-test-installed
ARGS   ?=
PYTEST_ARGS ?=

BOARD  ?= icebreaker
SEED   ?=
ICEPROG ?= iceprog
OPENFPGALOADER ?= openFPGALoader
BITSTREAM_icebreaker := build/icebreaker/top.bin
BITSTREAM_ulx3s      := build/ulx3s/top.bit

.PHONY: help train test bench bitstream prog clean distclean

help:
	@echo "make train   train 64-32-10 on digits with E2-Train settings, report energy"
	@echo "make test    run the test suite"
	@echo "make bench   run the benchmarks (build/bench/)"
	@echo "make bitstream BOARD=icebreaker|ulx3s   build a bitstream and build/BOARD/report.json"
	@echo "make prog BOARD=icebreaker|ulx3s        program a connected board"

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e .
	@touch $(STAMP)

$(TEST_STAMP): $(STAMP)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[test,fleet]'
	@touch $(TEST_STAMP)

train: $(STAMP)
	$(BIN)/ember train --backend sim --preset e2train --reference $(ARGS)

test: $(TEST_STAMP)
	$(BIN)/python -m pytest -n 2 --dist worksteal --durations=25 $(PYTEST_ARGS)

bench: $(TEST_STAMP)
	$(BIN)/python -m ember.bench $(ARGS)
	$(BIN)/python -m ember.bench --fleet $(ARGS)

bitstream: $(STAMP)
	$(BIN)/python -m ember_boards.build --board $(BOARD) $(if $(SEED),--seed $(SEED)) --out build/$(BOARD)

prog:
	@test -f "$(BITSTREAM_$(BOARD))" || { echo "no bitstream for BOARD=$(BOARD); run make bitstream BOARD=$(BOARD) first" >&2; exit 1; }
ifeq ($(BOARD),ulx3s)
	$(OPENFPGALOADER) -b ulx3s $(BITSTREAM_ulx3s)
else ifeq ($(BOARD),icebreaker)
	$(ICEPROG) $(BITSTREAM_icebreaker)
else
	$(error BOARD must be icebreaker or ulx3s, not '$(BOARD)')
endif

clean:
	rm -rf build .pytest_cache sim_build

distclean: clean
	rm -rf $(VENV) *.egg-info host/*.egg-info
