"""The two arms side by side: rates, verdicts, and whether they ran the same vLLM on the same inputs.

The study's own control mixed vLLM 0.31.0 (Flame) and 0.28.0 (standalone); here a mismatch is flagged,
as are different datasets, LoadGen settings or engine settings, and any non-compliant arm.
"""

from __future__ import annotations

import json
from pathlib import Path

from parity.errors import ParityError
from parity.manifest import file_ref, header, read_manifest, validate_document, write_manifest
from parity.record import package_versions


def _run(path: Path, arm: str, out_dir: Path) -> tuple[dict, dict]:
    doc = read_manifest(path)
    if doc.get("kind") != "mlperf" or doc.get("step") != "run":
        raise ParityError(f"{path} is not a `parity mlperf run` manifest")
    problems = validate_document(doc, path=path)
    if problems:  # a tampered or truncated run: say where, rather than fail on a missing key below
        raise ParityError(f"not a valid run manifest: {problems[0]}")
    if doc["arm"] != arm:
        raise ParityError(f"{path} is the {doc['arm']} arm, expected {arm}")
    if doc["sut"]["failed"]:  # its rate counts samples that were never answered
        raise ParityError(f"{path}: {doc['sut']['failed']} sample(s) failed in this run; "
                          f"a run with failed samples cannot be compared")
    r = doc["result"]
    return doc, {"manifest": file_ref(path, out_dir), "vllm_version": doc["engine"]["vllm_version"],
                 "validity": r["validity"], "compliant": doc["compliance"]["compliant"],
                 "samples_per_second": r["samples_per_second"], "tokens_per_second": r["tokens_per_second"],
                 "duration_s": r["duration_s"], "sample_count": r["sample_count"]}


def compose(standalone: Path, flame: Path, out_dir: Path) -> dict:
    """The comparison of two run manifests, as `compare` writes it (less its header and versions): what
    validation composes again from the runs a compare manifest links (`derived_problems`)."""
    a, sa = _run(standalone, "standalone", out_dir)
    b, sb = _run(flame, "flame", out_dir)
    flags = []
    versions = (sa["vllm_version"], sb["vllm_version"])
    match = None if versions == (None, None) else versions[0] == versions[1]
    if match is False:
        flags.append(f"vLLM versions differ: standalone {versions[0]}, flame {versions[1]}")
    if a["simulated"] != b["simulated"]:
        flags.append("one arm is simulated, the other is not")
    if a["mode"] != b["mode"]:
        flags.append(f"modes differ: {a['mode']} vs {b['mode']}")
    if a["dataset"]["file"]["sha256"] != b["dataset"]["file"]["sha256"]:
        flags.append("datasets differ")
    elif (a["dataset"]["samples"], a["dataset"]["prompt_tokens"]) != (b["dataset"]["samples"],
                                                                       b["dataset"]["prompt_tokens"]):
        # one file, another cut of it (--samples): an outsider's arms on 8 and 64 samples compared unflagged
        flags.append(f"sample sets differ: {a['dataset']['samples']} samples of the dataset vs "
                     f"{b['dataset']['samples']}")
    if a["settings"]["mlperf_conf_sha256"] != b["settings"]["mlperf_conf_sha256"]:
        flags.append("mlperf.conf differs (another LoadGen build)")
    conf_a, conf_b = (dict(d["settings"]["user_conf_values"], target_qps=None) for d in (a, b))
    if conf_a != conf_b:  # target_qps is each arm's own estimate
        flags.append("user.conf settings other than target_qps differ")
    args_a, args_b = dict(a["engine"]["args"]), dict(b["engine"]["args"])
    differing = sorted(k for k in args_a.keys() | args_b.keys() if args_a.get(k) != args_b.get(k))
    if differing:
        flags.append(f"engine settings differ: {', '.join(differing)}")
    flags += [f"{arm} arm is not compliant" for arm, s in (("standalone", sa), ("flame", sb)) if not s["compliant"]]

    def ratio(key: str) -> float | None:
        return round(sb[key] / sa[key], 4) if sa[key] and sb[key] is not None else None

    return {"simulated": a["simulated"] or b["simulated"], "step": "compare", "runs": {"standalone": sa, "flame": sb},
            "vllm_versions_match": match, "flags": flags,
            "flame_to_standalone_samples_per_second": ratio("samples_per_second"),
            "flame_to_standalone_tokens_per_second": ratio("tokens_per_second")}  # the official checker's metric


def compare(standalone: Path, flame: Path, out: Path) -> dict:
    fields = compose(standalone, flame, out.parent)
    doc = header("mlperf", simulated=fields.pop("simulated")) | fields | {"versions": package_versions()}
    write_manifest(out, doc)
    return doc


def derived_problems(path: Path, doc: dict) -> list[tuple[str, str]]:
    """(pointer, why) for each thing a compare manifest states that the two run manifests it links (by hash,
    checked before this) do not give: their numbers, the ratios, the flags and the label."""
    folder = Path(path).parent
    try:
        fields = compose(folder / doc["runs"]["standalone"]["manifest"]["path"],
                         folder / doc["runs"]["flame"]["manifest"]["path"], folder)
    except (ParityError, KeyError, TypeError, ZeroDivisionError) as exc:
        return [("/runs", f"cannot be composed again from the runs it links: {' '.join(str(exc).split())}")]
    fields = json.loads(json.dumps(fields))  # as a manifest holds it
    found = []
    for key, derived in fields.items():
        if key == "runs":
            found += [(f"/runs/{arm}/{k}", f"states {doc['runs'][arm].get(k)!r}, its run manifest gives {v!r}")
                      for arm, run in derived.items() for k, v in run.items() if doc["runs"][arm].get(k) != v]
        elif doc.get(key) != derived:
            found.append((f"/{key}", f"states {doc.get(key)!r}, its linked runs give {derived!r}"))
    return found
