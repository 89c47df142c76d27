"""Reading LoadGen's logs: `mlperf_log_summary.txt` (the verdict and its reasons) and
`mlperf_log_detail.txt` (one `:::MLLOG {json}` line per key: effective settings and results).
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

from parity.errors import ParityError

SUMMARY = "mlperf_log_summary.txt"
DETAIL = "mlperf_log_detail.txt"
ACCURACY = "mlperf_log_accuracy.json"

_SUMMARY_FIELDS = {
    "validity": r"Result is\s*:\s*(VALID|INVALID)",
    "min_duration_met": r"Min duration satisfied\s*:\s*(\w+)",
    "min_queries_met": r"Min queries satisfied\s*:\s*(\w+)",
    "early_stopping_met": r"Early stopping satisfied\s*:\s*(\w+)",
    "samples_per_second": r"Samples per second\s*:\s*([\d.eE+-]+)",
    "tokens_per_second": r"Tokens per second\s*:\s*([\d.eE+-]+)",
    "mode": r"Mode\s*:\s*(\w+)",
}


def _value(key: str, text: str):
    if key in ("samples_per_second", "tokens_per_second"):
        return float(text)
    if key.endswith("_met"):
        return text.lower() == "yes"
    return text


def parse_summary(text: str) -> dict:
    """The verdict, the three conditions, the rates, and LoadGen's recommendations when INVALID."""
    out = {}
    for key, pattern in _SUMMARY_FIELDS.items():
        match = re.search(pattern, text)
        out[key] = _value(key, match.group(1)) if match else None
    recommendations = re.search(r"Recommendations:\n((?:\s*\*.*\n?)+)", text)
    out["recommendations"] = ([line.strip().lstrip("*").strip() for line in recommendations.group(1).splitlines()
                               if line.strip()] if recommendations else [])
    out["no_errors"] = "No errors encountered during test." in text
    out["no_warnings"] = "No warnings encountered during test." in text
    return out


def parse_detail(text: str) -> dict:
    """Every `:::MLLOG` key and its value; a key logged more than once keeps its last value.
    Errors and warnings (`"metadata": {"is_error": true}`...) are collected separately."""
    values, errors, warnings = {}, [], []
    for line in text.splitlines():
        if not line.startswith(":::MLLOG "):
            continue
        try:
            entry = json.loads(line[len(":::MLLOG "):])
        except ValueError:
            continue
        key, value, meta = entry.get("key"), entry.get("value"), entry.get("metadata") or {}
        if meta.get("is_error"):
            errors.append(f"{key}: {value}")
        elif meta.get("is_warning"):
            warnings.append(f"{key}: {value}")
        values[key] = value
    return {"values": values, "errors": errors, "warnings": warnings}


def read_logs(log_dir: Path) -> dict:
    """Summary and detail of one LoadGen run, with the numbers the manifest reports."""
    try:
        summary = parse_summary((log_dir / SUMMARY).read_text(errors="replace"))
        detail = parse_detail((log_dir / DETAIL).read_text(errors="replace"))
    except FileNotFoundError as exc:
        raise ParityError(f"LoadGen wrote no {Path(exc.filename).name} in {log_dir}") from None
    v = detail["values"]
    per_query = v.get("generated_samples_per_query")
    queries = v.get("result_query_count") or (1 if per_query else 0)
    max_latency_ns = v.get("result_max_latency_ns")
    return {
        "summary": summary, "detail_errors": detail["errors"], "detail_warnings": detail["warnings"],
        "detail": {"validity": v.get("result_validity"), "samples_per_second": v.get("result_samples_per_second"),
                   "tokens_per_second": v.get("result_tokens_per_second")},
        "loadgen_version": v.get("loadgen_version"),
        "validity": v.get("result_validity", summary["validity"]),
        "samples_per_second": v.get("result_samples_per_second", summary["samples_per_second"]),
        "tokens_per_second": v.get("result_tokens_per_second", summary["tokens_per_second"]),
        "duration_s": max_latency_ns / 1e9 if max_latency_ns else None,
        "sample_count": per_query * queries if per_query else None,
        "effective": {key[len("effective_"):]: value for key, value in v.items() if key.startswith("effective_")},
    }


def summary_disagrees(logs: dict) -> str | None:
    """Where LoadGen's summary log states a verdict or rate its detail log (where the manifest's come from) does
    not: one line, or None. The two print the same digits, so a rate is compared to one part in 10^5."""
    for key in ("validity", "samples_per_second", "tokens_per_second"):
        stated, detailed = logs["summary"].get(key), logs["detail"].get(key)
        if stated is None or detailed is None:
            continue
        same = (stated == detailed if key == "validity"
                else math.isclose(float(stated), float(detailed), rel_tol=1e-5))
        if not same:
            return f"its summary says {key} {stated}, its detail log {detailed}"
    return None


def result_fields(result: dict, mode: str, failed: int = 0) -> dict:
    """An MLPerf run manifest's `result`, from `read_logs` of its LoadGen logs (a performance run's validity)
    and the SUT's count of `failed` samples: LoadGen counts a failed sample as answered, so its VALID is
    stated as INVALID when any failed (the summary log keeps LoadGen's word)."""
    validity = ("INVALID" if failed else result["validity"]) if mode == "performance" else None
    return {"validity": validity,
            "min_duration_met": result["summary"]["min_duration_met"],
            "min_queries_met": result["summary"]["min_queries_met"],
            "early_stopping_met": result["summary"]["early_stopping_met"],
            "recommendations": result["summary"]["recommendations"],
            "samples_per_second": result["samples_per_second"], "tokens_per_second": result["tokens_per_second"],
            "duration_s": result["duration_s"], "sample_count": result["sample_count"],
            "loadgen_errors": result["detail_errors"], "loadgen_warnings": result["detail_warnings"]}


def derived_problems(path: Path, doc: dict) -> list[tuple[str, str]]:
    """(pointer, why) for each number an MLPerf run manifest states that its LoadGen logs (linked by hash) do not
    give, or where its summary log (what people and MLCommons' checker read) disagrees with its detail log
    (`parity.rederive`); a compare manifest's, from the runs it links (`compare.derived_problems`)."""
    if doc.get("step") == "compare":
        from parity.mlperf.compare import derived_problems as compare_problems

        return compare_problems(path, doc)
    if doc.get("step") != "run" or SUMMARY not in doc.get("logs", {}) or DETAIL not in doc.get("logs", {}):
        return []
    folder = Path(path).parent
    summary, detail = (folder / doc["logs"][SUMMARY]["path"], folder / doc["logs"][DETAIL]["path"])
    if summary.parent != detail.parent:
        return [("/logs", "its LoadGen summary and detail lie in two folders: not one run's logs")]
    try:
        logs = read_logs(summary.parent)
        derived = result_fields(logs, doc["mode"], doc.get("sut", {}).get("failed") or 0)
        split = summary_disagrees(logs)  # a detail log's rate that is no number (an outsider's "abc": a traceback)
    except (ParityError, OSError, KeyError, ValueError, TypeError, AttributeError) as exc:
        return [("/logs", f"its LoadGen logs cannot be read again: {exc}")]
    if split:
        return [(f"/logs/{SUMMARY}", split)]
    derived = json.loads(json.dumps(derived))  # as a manifest holds it
    return [(f"/result/{key}", f"states {doc['result'].get(key)!r}, its LoadGen logs give {value!r}")
            for key, value in derived.items() if doc["result"].get(key) != value] + _settings_and_label(folder, doc, logs)


def _settings_and_label(folder: Path, doc: dict, logs: dict) -> list[tuple[str, str]]:
    """What a run manifest states of its settings, its dataset and its compliance, against what it links: LoadGen's
    effective settings (its detail log), its user.conf, its dataset file (the same first `samples` entries), and the
    label `compliance` gives them (an outsider's forgery of a 'compliant', measured run of 13,368 samples passed)."""
    from types import SimpleNamespace

    from parity.mlperf.compliance import compliance
    from parity.mlperf.dataset import load_dataset

    found = []
    settings = doc.get("settings") or {}
    effective = json.loads(json.dumps(logs["effective"]))
    if settings.get("effective") != effective:
        found.append(("/settings/effective", f"states {settings.get('effective')!r}, its LoadGen detail log gives "
                                             f"{effective!r}"))
    if "user_conf" in settings:
        try:
            written = _user_conf((folder / settings["user_conf"]["path"]).read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            return found + [("/settings/user_conf", f"cannot be read again: {exc}")]
        stated = settings.get("user_conf_values") or {}
        if set(written) != set(stated) or any(float(written[k]) != float(stated[k]) for k in written):
            found.append(("/settings/user_conf_values", f"state {stated!r}, its user.conf gives {written!r}"))
    stated = doc.get("dataset") or {}
    try:
        whole = load_dataset(folder / stated["file"]["path"])
    except (ParityError, KeyError, TypeError) as exc:
        return found + [("/dataset", f"its dataset cannot be read again: {exc}")]
    samples = stated.get("samples")
    if not isinstance(samples, int) or not 0 < samples <= len(whole.prompts):
        return found + [("/dataset/samples", f"states {samples!r}, its dataset file holds {len(whole.prompts)}")]
    dataset = whole.first(samples)  # the file read once (it was read again for its first samples)
    again = dataset.describe(folder)
    for key in ("samples", "origin", "synthetic", "prompt_tokens"):
        if stated.get(key) != again[key]:
            found.append((f"/dataset/{key}", f"states {stated.get(key)!r}, its dataset file gives {again[key]!r}"))
    args = (doc.get("engine") or {}).get("args") or {}
    label = compliance(doc["mode"], SimpleNamespace(max_tokens=args.get("max_tokens"),
                                                    ignore_eos=args.get("ignore_eos", False)),
                       logs, dataset, doc.get("simulated", True), (doc.get("sut") or {}).get("failed") or 0)
    if doc.get("compliance") != label:
        found.append(("/compliance", f"states {doc.get('compliance')!r}, what the run links gives {label!r}"))
    return found


def _user_conf(text: str) -> dict:
    """A user.conf's KEY = VALUE lines (`settings.UserConf.text`) as key: number."""
    values = {}
    for line in text.splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            name, _, value = line.partition("=")
            values[name.strip().rsplit(".", 1)[-1]] = float(value)
    return values
