"""Kernel compilations inside a timed window, as vLLM's own JIT monitor reports them (ours).

On a cold compile cache a Triton kernel compiled inside the measured phase of every sustained trial: 13-18% of
the achieved rate lost at 8 requests/s, on both paths alike, which burst warmups never triggered. vLLM (0.26 on)
watches for exactly this: after its start-up warm-up it activates a monitor (`vllm.utils.jit_monitor`) that logs
each Triton JIT compilation or autotuning run during inference (every one with `jit_monitor_verbose`). We use it
rather than a detector of our own: through vLLM's logging config (VLLM_LOGGING_CONFIG_PATH, which its engine core
inherits) that one logger also writes to a file per engine, each line stamped with the wall clock, so a trial can
say which compilations fell in its warm-up and which inside its timed window (and is then not counted:
parity.checks). vLLM's own log output is configured as its default does.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

MONITOR_LOGGER = "vllm.utils.jit_monitor"
CONFIG_ENV = "VLLM_LOGGING_CONFIG_PATH"
DIR_ENV = "PARITY_JIT_DIR"  # where a Flame worker's engine writes its file (set by parity.flame.service.worker_environment)
_FORMAT = "%(levelname)s %(asctime)s [%(filename)s:%(lineno)d] %(message)s"  # vLLM's, without its own formatter class


def logging_config(jit_log: Path, engine_log: Path | None = None) -> dict:
    """vLLM's default logging (INFO to stdout) plus the monitor's records, also to `jit_log` as `WALL_S MESSAGE`;
    with `engine_log`, vLLM's whole log also to that file (a Flame worker's stdout goes with its executor)."""
    level = os.environ.get("VLLM_LOGGING_LEVEL", "INFO")
    config = {
        "version": 1, "disable_existing_loggers": False,
        "formatters": {"vllm": {"format": _FORMAT, "datefmt": "%m-%d %H:%M:%S"},
                       "jit": {"format": "%(created).6f %(message)s"}},
        "handlers": {"vllm": {"class": "logging.StreamHandler", "formatter": "vllm", "level": level,
                              "stream": os.environ.get("VLLM_LOGGING_STREAM", "ext://sys.stdout")},
                     "jit": {"class": "logging.FileHandler", "formatter": "jit", "level": "WARNING",
                             "filename": str(jit_log), "delay": True}},
        "loggers": {"vllm": {"handlers": ["vllm"], "level": level, "propagate": False},
                    MONITOR_LOGGER: {"handlers": ["jit"], "level": "INFO", "propagate": True}},
    }
    if engine_log is not None:
        config["formatters"]["file"] = {"format": "%(process)d " + _FORMAT, "datefmt": "%m-%d %H:%M:%S"}  # 2 processes
        config["handlers"]["file"] = {"class": "logging.FileHandler", "formatter": "file", "level": level,
                                      "filename": str(engine_log), "delay": True}
        config["loggers"]["vllm"]["handlers"].append("file")
    return config


def environment(jit_log: Path, engine_log: Path | None = None) -> dict[str, str]:
    """The variables that route an engine's monitor records to `jit_log` (its config written beside it), and
    with `engine_log` its whole log to that file too."""
    jit_log.parent.mkdir(parents=True, exist_ok=True)
    for old in (jit_log, engine_log):  # an earlier run's compilations and lines are not this engine's
        if old is not None:
            old.unlink(missing_ok=True)
    config = jit_log.with_suffix(".logging.json")
    config.write_text(json.dumps(logging_config(jit_log, engine_log)))
    return {CONFIG_ENV: str(config)}


def read(jit_log: Path) -> list[tuple[float, str]]:
    """(wall time, message) of each compilation the engine logged so far; none if it logged none."""
    try:
        lines = jit_log.read_text(errors="replace").splitlines()
    except FileNotFoundError:
        return []
    events = []
    for line in lines:
        stamp, _, message = line.partition(" ")
        try:
            events.append((float(stamp), message))
        except ValueError:  # a message's continuation line
            if events:
                events[-1] = (events[-1][0], events[-1][1] + " " + line)
    return events


def kernel(message: str) -> str:
    """The short form of one record: `Triton kernel JIT compilation during inference: NAME` (details dropped)."""
    return message.split(" (", 1)[0].split(". This causes", 1)[0]


def window(logs: list[Path], since: float, start: float, end: float) -> dict:
    """What the engines compiled in [since, start) (the trial's warm-ups) and inside [start, end] (its timed
    window), as a trial records it."""
    events = [e for log in logs for e in read(log)]
    inside = sorted(e for e in events if start <= e[0] <= end)
    return {"monitored": True, "warmup": sum(1 for at, _ in events if since <= at < start),
            "measured": [kernel(message) for _, message in inside]}
