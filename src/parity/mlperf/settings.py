"""LoadGen settings: the `mlperf.conf` compiled into LoadGen, and the `user.conf` written per run.

Only the keys the rules let `user.conf` override are written. `TestSettings.FromConfig` reads the
embedded `mlperf.conf` on its first call in a process only (a `static` counter in LoadGen), so a second
call here is refused rather than silently running without the official seeds.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path

from parity.errors import ParityError
from parity.manifest import atomic_write_text, sha256_bytes
from parity.mlperf import MODEL, SCENARIO

_CONF_MARKER = b"*.*.qsl_rng_seed = "
_configured = False


def loadgen():
    """The `mlperf_loadgen` module, or a clear error naming the package to install."""
    try:
        import mlperf_loadgen
    except ImportError:
        raise ParityError("MLPerf LoadGen is not installed: pip install mlcommons-loadgen==5.1.1") from None
    return mlperf_loadgen


@lru_cache(maxsize=1)
def embedded_mlperf_conf() -> bytes:
    """`mlperf.conf` as compiled into the LoadGen binary (one C string holding the seeds)."""
    data = Path(loadgen().__file__).read_bytes()
    at = data.find(_CONF_MARKER)
    if at < 0:
        raise ParityError(f"no mlperf.conf found inside {loadgen().__file__}")
    return data[data.rfind(b"\0", 0, at) + 1:data.find(b"\0", at)]


def mlperf_conf_sha256() -> str:
    return sha256_bytes(embedded_mlperf_conf())


@dataclass(frozen=True)
class UserConf:
    """The per-run overrides; None keeps mlperf.conf's value."""

    target_qps: float | None = None
    min_duration: int | None = None  # ms
    min_query_count: int | None = None
    performance_sample_count_override: int | None = None

    def text(self) -> str:
        lines = [f"{MODEL}.{SCENARIO}.{key} = {value}" for key, value in asdict(self).items() if value is not None]
        return "\n".join(lines) + "\n"

    def write(self, path: Path) -> Path:
        atomic_write_text(path, self.text())
        return path


def offline_settings(user_conf: Path, mode: str):
    """Offline TestSettings from mlperf.conf + user.conf, in PerformanceOnly or AccuracyOnly mode."""
    global _configured
    lg = loadgen()
    if _configured:
        raise ParityError("LoadGen reads mlperf.conf only once per process: run each arm and mode in its own "
                          "process (`parity mlperf run`)")
    _configured = True
    settings = lg.TestSettings()
    settings.scenario = lg.TestScenario.Offline
    settings.FromConfig(str(user_conf), MODEL, SCENARIO)
    settings.mode = lg.TestMode.AccuracyOnly if mode == "accuracy" else lg.TestMode.PerformanceOnly
    return settings


def log_settings(outdir: Path):
    """Logs into `outdir`, without the (large) trace log."""
    lg = loadgen()
    output = lg.LogOutputSettings()
    output.outdir = str(outdir)
    output.copy_summary_to_stdout = False
    settings = lg.LogSettings()
    settings.log_output = output
    settings.enable_trace = False
    return settings
