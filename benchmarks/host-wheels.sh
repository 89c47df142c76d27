#!/usr/bin/env bash
# Run HERE, on a machine that reaches PyPI, from the repo root: the wheels of snakemake 9.27.1 and of every
# package it needs that our offline GPU hosts lack (Python 3.12, x86-64; the host's own list is torch's image's,
# see the device notes), and of what `parity bundle` and `parity report` add (rocrate, bagit, markdown), into .whl/
# (git-ignored). benchmarks/host.sh installs them there. Not fetched: pulp
# (16 MB, only the ILP scheduler uses it; profiles/host schedules greedily). connection_pool and bagit publish no
# wheel, so theirs are built here (pure Python). The versions are those the CPU workflow is tested with.
set -euo pipefail
dest=${1:-.whl}
mkdir -p "$dest"
platforms=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_24_x86_64 manylinux_2_17_x86_64 \
         manylinux2014_x86_64 manylinux_2_5_x86_64 manylinux1_x86_64; do platforms+=(--platform "$p"); done
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  "${platforms[@]}" -d "$dest" \
  snakemake==9.27.1 snakemake-interface-common==1.23.0 snakemake-interface-executor-plugins==9.4.0 \
  snakemake-interface-logger-plugins==2.1.0 snakemake-interface-report-plugins==1.3.0 \
  snakemake-interface-scheduler-plugins==2.0.2 snakemake-interface-storage-plugins==4.4.1 \
  annotated-types==0.8.0 argparse-dataclass==2.0.0 conda-inject==1.3.2 configargparse==1.9.0 docutils==0.22.4 \
  dpath==2.2.0 fastjsonschema==2.22.3 gitdb==4.0.12 gitpython==3.2.1 greenlet==3.5.6 humanfriendly==10.0 \
  immutables==0.21 jsonschema==4.26.0 jsonschema-specifications==2025.9.1 jupyter-core==5.9.1 nbformat==5.11.1 \
  platformdirs==4.14.9 pydantic==2.14.4 pydantic-core==2.50.5 referencing==0.37.0 rpds-py==2026.9.1 \
  smart-open==7.7.1 smmap==5.0.3 sqlalchemy==2.0.58 sqlmodel==0.0.37 tenacity==9.2.1 throttler==1.2.3 \
  traitlets==5.16.1 typing-inspection==0.4.5 yte==1.9.4 \
  rocrate==0.16.0 arcp==0.2.1 markdown==3.11.3 python-dateutil==4.0.0 six==1.17.0
python3 -m pip wheel -q --no-deps -w "$dest" connection-pool==0.0.3 bagit==1.9.0  # neither publishes a wheel
# jsonschema, referencing, rpds-py, pydantic and its helpers are the vLLM bundle's versions too: either copy serves.
echo "$(ls "$dest"/*.whl | wc -l) wheels in $dest: $(du -sh "$dest" | cut -f1) ($(du -sb "$dest" | cut -f1) bytes)"
