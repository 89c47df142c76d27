"""The `parity` command: thin click adapters, one module per group of commands; a command parses its
options, calls one function of the module that does the work, and prints what it returns.

`options` declares the options several commands share, `errors` how a command fails, `app` the group
every module adds its commands to (importing a module registers them).
"""

from parity.cli.app import main
from parity.cli import bench, bench_placing, evidence, inputs, mlperf, runs

__all__ = ["main", "bench", "bench_placing", "evidence", "inputs", "mlperf", "runs"]
