# The two set-up commands of the README. Both create .venv and install what they need.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
export PATH := $(abspath $(VENV))/bin:$(PATH)

.PHONY: smoke test install clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test,workflow,slurm]'
	touch $(STAMP)

install: $(STAMP)

## make smoke: the smoke workflow, end to end, on the CPU (simulator engine, Flame stand-in)
smoke: $(STAMP)
	$(BIN)/snakemake --workflow-profile smoke all

## make test: the test suite
test: $(STAMP)
	$(BIN)/python -m pytest -q

clean:
	rm -rf results .snakemake
