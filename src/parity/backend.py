"""Where a run happens, from the workflow config: the engine family, the GPUs, the Flame cluster (the experiments'
`backend`, and an MLPerf arm's; `parity.mlperf.run.RunSpec` holds one).

A profile changes this configuration, never the code path. The smoke profile names the simulator,
simulated GPUs and the Flame stand-in; the GPU profiles name vLLM, the node's GPU UUIDs and a real
Flame v0.6.0 cluster. `network` (auto, netns, host; see `parity.netns`) says whether the job runs
in a network namespace of its own, since real Flame listens on 0.0.0.0 unauthenticated.
"""

from __future__ import annotations

import dataclasses
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from parity.engine import EngineArgs
from parity.errors import ParityError
from parity.gpus import check as check_gpus
from parity.manifest import one_line, read_regular, strict_loads
from parity.workflow_config import check_backend, parse_yaml


def _exists(path: Path) -> bool:
    """Whether `path` is there; False for text that cannot name a file at all (too long, a NUL byte)."""
    try:
        return path.exists()
    except (OSError, ValueError):
        return False


CLUSTERS = ("standin", "flame")  # the CPU stand-in of Flame's session manager, or real Flame v0.6.0


@dataclass(frozen=True)
class Backend:
    engine: str = "sim"
    gpus: tuple[str, ...] = ("sim-0", "sim-1")
    cluster: str = "standin"
    flame_bin_dir: str | None = None
    model: str | None = None
    load_format: str | None = None
    engine_args: dict = field(default_factory=dict)
    sim_params: str | None = None
    warmup_rounds: int = 2
    startup_timeout_s: float = 900.0
    network: str = "auto"
    engine_cpus: int = 0  # ours (issue 28): CPUs of its own per vLLM engine core (parity.cpus); 0: as the study ran

    @classmethod
    def from_dict(cls, values: dict) -> "Backend":
        check_backend(values)  # names an unknown key, a wrong type, an out-of-range or non-finite value
        values = dict(values)
        if "gpus" in values:
            values["gpus"] = tuple(values["gpus"]) if isinstance(values["gpus"], list) else values["gpus"]
        for key in ("sim_params", "flame_bin_dir"):  # Flame workers run in their own directories
            if values.get(key):
                values[key] = str(Path(values[key]).resolve())
        if values.get("engine", cls.engine) == "sim" and values.get("sim_params"):  # read now, in one line: each
            # shard read it only once started, leaving a half-written --out (an outside tester's, 2026-12-06)
            from parity.engine.sim import SimParams

            SimParams.load(Path(values["sim_params"]))
        if values.get("model") and Path(values["model"]).is_dir():  # a local model folder, not a Hub id
            values["model"] = str(Path(values["model"]).resolve())
        return cls(**values)  # every value already checked against the schema

    @classmethod
    def parse(cls, text: str) -> "Backend":
        """From JSON text or a JSON/YAML file path (Snakemake passes the config's `backend` as JSON); anything
        unreadable is refused in one line (`parse_yaml`, `parity.manifest.strict_loads`: a key given twice too)."""
        path = Path(text)
        as_file = not text.lstrip().startswith("{") and _exists(path)
        try:
            values = parse_yaml(read_regular(path).decode("utf-8")) if as_file else strict_loads(text)
        except (OSError, ValueError) as exc:  # ValueError: bad JSON or YAML, and UnicodeDecodeError
            if not as_file and not text.lstrip().startswith(("{", "[")):  # a file's name, not JSON text
                if path.is_symlink():  # there, but naming nothing: not "no such file" (an outsider's)
                    raise ParityError(f"backend: {text}: a link to nothing (a dangling link, or a loop of links)") \
                        from None
                raise ParityError(f"backend: {text}: no such file (give a JSON or YAML file, or a JSON object)") from None
            named = f" {text}:" if as_file else ""
            raise ParityError(f"backend:{named} neither JSON nor a readable YAML file ({one_line(str(exc))})") from None
        if values is None:  # an empty file (or `null`) is no backend, not every default: a file cut short on a GPU
            # host would otherwise run the simulator without a word (an outside tester's, 2026-12-06); `{}` is
            raise ParityError(f"backend:{' ' + text + ':' if as_file else ''} empty (give a mapping; {{}} for "
                              "every default)")
        if not isinstance(values, dict):
            raise ParityError(f"backend: expected a mapping, got {type(values).__name__}")
        return cls.from_dict(values)

    def to_dict(self) -> dict:
        """The backend as `from_dict` takes it back (JSON: how it is passed whole to a child process)."""
        return dataclasses.asdict(self) | {"gpus": list(self.gpus)}

    @property
    def simulated(self) -> bool:
        return self.engine == "sim"

    @property
    def reserved_engine_cpus(self) -> int:
        """The CPUs parity.cpus reserves per engine core: `engine_cpus`, none on the simulator (it has no engine core
        process); what a trial runs with and records."""
        return 0 if self.simulated else self.engine_cpus

    def args(self) -> EngineArgs:
        values = dict(self.engine_args)
        if self.model:
            values["model"] = self.model
        if self.load_format:
            values["load_format"] = self.load_format
        return EngineArgs.from_dict(values)

    def gpu_uuids(self, needed: int = 1, what: str = "this run") -> list[str]:
        """The GPU UUIDs to pin shards to. `auto`: the node's GPUs from nvidia-smi, in index order, at most two
        (the study's node); a run that pairs two GPUs says so (`needed=2`) and is refused on a one-GPU node,
        where the offline limit's shards and the MLPerf arms still run. GPUs named in the config are taken as named,
        once each, and only those this machine (or the simulator) has (`parity.gpus`)."""
        if list(self.gpus) != ["auto"]:
            check_gpus(list(self.gpus), simulated=self.simulated)
            return list(self.gpus)
        try:
            out = subprocess.run(["nvidia-smi", "--query-gpu=uuid", "--format=csv,noheader"], check=True,
                                 capture_output=True, text=True, timeout=30).stdout
        except (OSError, subprocess.SubprocessError) as exc:
            raise ParityError(f"gpus: auto needs nvidia-smi ({exc}); name the GPU UUIDs in the config") from None
        uuids = [line.strip() for line in out.splitlines() if line.strip()]
        if len(uuids) < needed:
            raise ParityError(f"{what} needs {needed} GPU{'s' if needed > 1 else ''} (gpus: auto); nvidia-smi lists "
                              f"{len(uuids)} on this host")
        return uuids[:2]
