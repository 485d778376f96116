# Tollgate. `make run` serves the gateway; `make test` runs lint, types and the suite.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

.PHONY: run test bench db-start db-stop clean-data

$(STAMP): requirements.txt requirements-dev.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -r requirements-dev.txt
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/python -m devtools.run

test: $(STAMP)
	$(BIN)/python -m devtools.check

# Every benchmark under bench/, then BENCHMARKS.md (about three minutes).
bench: $(STAMP)
	$(BIN)/python -m devtools.bench

db-start: $(STAMP)
	$(BIN)/python -m devtools.pg start

db-stop: $(STAMP)
	$(BIN)/python -m devtools.pg stop
