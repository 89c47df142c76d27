"""The GPUs a run gives its shards, checked before anything starts: one shard per GPU, each on this machine.

A GPU named twice would put two shards (replicas, Flame workers, offline-limit shards) on one GPU, where
they share its memory and compute: a run that no longer measures what it says. A GPU this machine does
not have fails only once its engine starts (after the warmups, for the simulator, whose GPU name ends up
in the trial manifest), so it is refused first. The simulator's GPUs are named sim-0, sim-1, ...; a real
GPU is one `nvidia-smi -L` lists (a GPU or MIG UUID).
"""

from __future__ import annotations

import re
import subprocess

from parity.errors import ParityError

SIMULATED = re.compile(r"sim-\d+")
LISTED = re.compile(r"\(UUID: ((?:GPU|MIG)-[^)\s]+)\)")  # nvidia-smi -L: "GPU 0: NVIDIA H200 (UUID: GPU-...)"


def on_this_machine() -> list[str]:
    """The GPU and MIG UUIDs nvidia-smi lists on this machine."""
    try:
        out = subprocess.run(["nvidia-smi", "-L"], check=True, capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        raise ParityError(f"cannot list this machine's GPUs to check the ones given (nvidia-smi: {exc})") from None
    return LISTED.findall(out)


def check(gpus: list[str], *, simulated: bool) -> None:
    """ParityError, in one line, for a GPU given to two shards or one this machine (or the simulator) lacks."""
    twice = sorted({gpu for gpu in gpus if gpus.count(gpu) > 1})
    if twice:
        raise ParityError(f"GPU {twice[0]} is given to {gpus.count(twice[0])} shards ({', '.join(gpus)}); "
                          "each shard needs a GPU of its own")
    if simulated:
        if bad := [gpu for gpu in gpus if not SIMULATED.fullmatch(gpu)]:
            raise ParityError(f"GPU {bad[0]} is not a simulated GPU: the simulator's are named sim-0, sim-1, ...")
        return
    present = on_this_machine()
    if missing := [gpu for gpu in gpus if gpu not in present]:
        raise ParityError(f"GPU {missing[0]} is not on this machine (nvidia-smi lists "
                          f"{', '.join(present) or 'none'})")


def visible_simulated(environ) -> str:
    """The simulated GPU a process was given, as a real one is (CUDA_VISIBLE_DEVICES naming one GPU: the offline
    limit's shards), else sim-0; each shard's records named sim-0 when they ran on sim-0 and sim-1."""
    given = environ.get("CUDA_VISIBLE_DEVICES", "")
    return given if SIMULATED.fullmatch(given) else "sim-0"
