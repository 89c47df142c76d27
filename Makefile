# The two set-up commands of the README. Both create .venv and install what they need.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
export PATH := $(abspath $(VENV))/bin:$(PATH)

.PHONY: smoke test install clean image smoke-image

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test,workflow,slurm]'
	touch $(STAMP)

install: $(STAMP)

## make smoke: the smoke workflow, end to end, on the CPU (simulator engine, Flame stand-in)
smoke: $(STAMP)
	$(BIN)/snakemake --workflow-profile smoke all
	@tail -n 1 results/smoke-bundle.log
	@echo "make smoke: done (simulated, every number): the report is results/smoke/report/report.md (and .html);" \
	    "the evidence bundle results/smoke-bundle/, checked as its log says (results/smoke-bundle.log)"

## make image: the offline variant of the image (local bases: containers/offline-base.sh; NOT the reviewers'
## image, which containers/build.sh builds from the digest-pinned bases). One line and nothing else where
## apptainer is not on PATH. IMAGE_LOCK=FILE installs another lock (e.g. its CPU part); IMAGE_FLAGS go to build.sh.
IMAGE        ?= results/image/parity-offline.sif
OFFLINE_BASE ?= results/image/offline-base
IMAGE_LOCK   ?= containers/requirements.lock
IMAGE_FLAGS  ?=
FLAME_BIN    ?=
image:
	@if ! command -v apptainer >/dev/null 2>&1; then echo "make image: skipped: apptainer is not on PATH"; exit 0; fi; \
	set -e; $(MAKE) --no-print-directory $(STAMP); \
	if [ ! -x $(OFFLINE_BASE)/rootfs/opt/python3.12/bin/python3.12 ]; then FLAME_BIN=$(FLAME_BIN) containers/offline-base.sh $(OFFLINE_BASE); fi; \
	containers/build.sh --variant offline --base-dir $(OFFLINE_BASE) --lock $(IMAGE_LOCK) --out $(IMAGE) $(IMAGE_FLAGS)

## make smoke-image: the smoke workflow with every job inside $(IMAGE) (--sdm apptainer, as profiles/default
## runs on GPU nodes: --cleanenv, /tmp bound, --nv where nvidia-smi is found, --drop-caps for what root lacks
## here: containers/host-caps.sh; the image's folder bound read-only, since `all` hashes the image from inside
## it for the bundle); --forceall, so no job is reused from a host run. The same results folder and report as make smoke.
smoke-image: $(STAMP)
	@command -v apptainer >/dev/null 2>&1 || { echo "make smoke-image: apptainer is not on PATH"; exit 1; }
	@[ -f $(IMAGE) ] || { echo "make smoke-image: $(IMAGE) is not built: run make image"; exit 1; }
	@missing="$$(containers/host-caps.sh)"; \
	if [ -n "$$missing" ]; then echo "make smoke-image: root here lacks $$missing: jobs run with --drop-caps $$missing"; fi; \
	set -x; $(BIN)/snakemake all --workflow-profile smoke --forceall --software-deployment-method apptainer \
	    --apptainer-args "--cleanenv --bind /tmp --bind $(abspath $(dir $(IMAGE))):$(abspath $(dir $(IMAGE))):ro$(if $(shell command -v nvidia-smi), --nv)$${missing:+ --drop-caps $$missing}" \
	    --config container=$(abspath $(IMAGE))

## make test: the test suite
test: $(STAMP)
	$(BIN)/python -m pytest -q

clean:
	rm -rf results .snakemake
