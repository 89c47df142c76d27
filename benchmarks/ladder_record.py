"""A device session's ladder record (benchmarks/measured/h200-ladder-*.json): its trials, pairs and rungs derived
from the trial manifests, and a record checked against the archive it names, so every number it states about a
trial or a pair is what `parity.latency` derives from the archived manifest whose SHA-256 it gives.

  python benchmarks/ladder_record.py derive TRIALS_DIR      the trials, pairs, rungs and bounded rungs as JSON (a session adds
                                                            its GPUs, commands, calls and conclusion by hand)
  python benchmarks/ladder_record.py check RECORD.json ...  one line per disagreement; exit 1 if there is any

A record lists the trials it ran (`trials`) and the pairs it states (`pairs`, or a top-level object with a `pair`
key); a check compares each number the record and the derivation both have (a record written before a field
existed simply lacks it), to its rounding. A record that names the experiment manifest its archive holds
(`experiment`: {path, sha256}, so `parity report --experiment` draws from the archive) is checked against it too:
that file byte for byte, linking exactly the archive's trials, against the objective they were admitted by.
"""

from __future__ import annotations

import errno
import hashlib
import io
import json
import math
import os
import re
import statistics
import sys
from pathlib import Path

from parity import tarball
from parity.checks import timing_mismatch
from parity.experiments.derive import admitted_against
from parity.latency import paired_ttft_delta, summarize
from parity.manifest import ManifestError, read_regular, strict_loads
from parity.stats import rps

SIDES = ("flame", "vllm")
# issue 30's bounded ladder (parity.experiments.plan.sustained with bounded_rates): each rung's unbounded sticky
# standalone comparator and both paths bounded, unpaired (each refuses its own requests)
ADMISSION = re.compile(r"^sustained-rate-(?P<rate>[0-9.]+)(?P<length>-out[0-9]+)?-(?P<arm>bounded|unbounded)-(?P<trace>.+)"
                       r"-p(?P<seed>[0-9]+)-(?P<side>vllm|flame)$")


def _ms(p: dict | None) -> dict | None:
    """Percentiles in ms; None where there were none (a bounded arm whose window was all refused)."""
    return None if p is None else {q: round(p[q] * 1000, 2) for q in ("p50", "p90", "p99")}


def _uuids(doc: dict) -> list[str]:
    return [g["uuid"] for g in doc["gpus"]]


def _cached(doc: dict) -> int:
    return sum(r.get("cached_tokens", 0) for r in doc["records"])


def trial(doc: dict, raw: bytes, s: dict | None) -> dict:
    """One trial's entry: its identity, hashes and (for a paced one, `s` its summary) latencies in the
    steady-state window."""
    out = {"trial": doc["trial_id"], "gpu": _uuids(doc), "status": doc["verdict"]["status"],
           "requests_per_s": round(rps(doc), 4), "trace_sha256": doc["trace"]["sha256"],
           "manifest_sha256": hashlib.sha256(raw).hexdigest(), "cached_tokens": _cached(doc)}
    if s is not None:
        out |= {"achieved_per_s": round(s["achieved_per_s"], 4), "saturated": s["saturated"],
                "schedule_offsets_sha256": doc["schedule"]["offsets_sha256"], "ttft_client_ms": _ms(s["ttft_client"]),
                "itl_ms": _ms(s["itl"]), "e2e_ms": _ms(s["e2e"])}
    return out


def pair(name: str, flame: dict, vllm: dict, sf: dict | None, sv: dict | None) -> dict:
    """A pair's entry: Flame over standalone, from its two trials and their summaries (a paced pair's latencies; a
    burst's rate)."""
    key = lambda r: r["request_id"]  # noqa: E731
    same = all(a["output_token_ids"] == b["output_token_ids"]
               for a, b in zip(sorted(flame["records"], key=key), sorted(vllm["records"], key=key)))
    out = {"pair": name, "gpu": flame["gpus"][0]["uuid"], "same_gpu": _uuids(flame) == _uuids(vllm),
           "token_ids_identical": same and len(flame["records"]) == len(vllm["records"]),
           "cached_tokens": [_cached(flame), _cached(vllm)],
           "requests_per_s_ratio": round(rps(flame) / rps(vllm), 4)}
    if sf is None or sv is None:  # a burst: the study's ratio
        return out | {"ratio": out["requests_per_s_ratio"]}
    out |= {"achieved_ratio": round(sf["achieved_per_s"] / sv["achieved_per_s"], 4),
            "ttft_client_p99_ratio": round(sf["ttft_client"]["p99"] / sv["ttft_client"]["p99"], 4),
            "ttft_client_p50_delta_ms": round(1000 * (sf["ttft_client"]["p50"] - sv["ttft_client"]["p50"]), 1),
            "ttft_client_p50_ms": [round(1000 * x["ttft_client"]["p50"], 1) for x in (sf, sv)],
            # request by request (one schedule, so the same requests): what the p50 delta holds beside the mode's
            # own cost, the slope of the distribution at its median
            "ttft_client_paired_delta_ms": _ms(d) if (d := paired_ttft_delta(flame, vllm)) else None,
            "itl_p99_ratio": round(sf["itl"]["p99"] / sv["itl"]["p99"], 4),
            "itl_p50_ratio": round(sf["itl"]["p50"] / sv["itl"]["p50"], 4),
            "e2e_p50_ratio": round(sf["e2e"]["p50"] / sv["e2e"]["p50"], 4),
            "saturated": [sf["saturated"], sv["saturated"]]}
    if h := flame.get("harvest"):
        out["harvest"] = {"tasks": h["tasks"], "empty_tasks": h["empty_tasks"], "events": h["events"],
                          "completions": h["completions"],
                          **{k.removesuffix("_s") + "_ms": {q: round(v * 1000, 3) for q, v in h[k].items()}
                             for k in ("arrival_to_seen_s", "event_to_client_s", "round_trip_s", "wait_s")}}
    return out


def rungs(pairs: list[dict]) -> list[dict]:
    """Per paced rung (a sustained pair's stage, every seed): the median and worst pair, against issue 28's targets."""
    by: dict[str, list[dict]] = {}
    for p in pairs:
        if "achieved_ratio" in p and p["pair"].startswith("sustained-"):
            by.setdefault(p["pair"].removeprefix("sustained-").rsplit("-", 1)[0], []).append(p)
    out = []
    for stage, ps in by.items():
        entry = {"rung": stage, "pairs": len(ps),
                 "achieved_ratio": {"median": round(statistics.median(p["achieved_ratio"] for p in ps), 4),
                                    "worst": min(p["achieved_ratio"] for p in ps)},
                 "ttft_client_p99_ratio": {
                     "median": round(statistics.median(p["ttft_client_p99_ratio"] for p in ps), 4),
                     "worst": max(p["ttft_client_p99_ratio"] for p in ps)},
                 "ttft_client_p50_delta_ms": [p["ttft_client_p50_delta_ms"] for p in ps],
                 "token_ids_identical": all(p["token_ids_identical"] for p in ps),
                 "cached_tokens_equal": all(p["cached_tokens"][0] == p["cached_tokens"][1] for p in ps)}
        if all("harvest" in p for p in ps):
            entry |= {"arrival_to_seen_p99_ms": max(p["harvest"]["arrival_to_seen_ms"]["p99"] for p in ps),
                      "event_to_client_p99_ms": max(p["harvest"]["event_to_client_ms"]["p99"] for p in ps)}
        out.append(entry)
    return out


def _arm(s: dict) -> dict:
    """One admission arm's numbers at a rung: rates, goodput (the first-token part and the whole objective),
    what it admitted and refused in the window, and its admitted requests' client TTFT."""
    r4 = lambda x: None if x is None else round(x, 4)  # noqa: E731
    return {"achieved_per_s": r4(s["achieved_per_s"]), "goodput_ttft_per_s": r4(s["goodput_ttft_client_per_s"]),
            "goodput_per_s": r4(s["goodput_client_per_s"]), "admitted": s.get("admitted"), "refused": s.get("refused"),
            "ttft_client_ms": _ms(s["ttft_client"]), "saturated": s["saturated"]}


def bounded(summaries: dict[str, dict]) -> list[dict]:
    """Per bounded-ladder rung and seed: each arm (unbounded-vllm, bounded-vllm, bounded-flame) and issue 30's ratios:
    the bounded standalone arm's first-token goodput and admitted completions/s over the unbounded arm's goodput and
    achieved rate, and Flame's bounded first-token goodput over standalone's."""
    by: dict[tuple, dict] = {}
    for tid, s in summaries.items():
        if (m := ADMISSION.match(tid)) and s is not None:
            key = (m["trace"], m["length"] or "", float(m["rate"]), int(m["seed"]))
            by.setdefault(key, {})[f"{m['arm']}-{m['side']}"] = _arm(s)
    out = []
    for (trace, length, rate, seed), arms in sorted(by.items()):
        entry = {"rung": f"rate-{rate:g}{length}-{trace}-p{seed}", "offered_per_s": rate, "arms": arms}
        free, vllm, flame = (arms.get(k) for k in ("unbounded-vllm", "bounded-vllm", "bounded-flame"))
        ratio = lambda a, b: round(a / b, 4) if a is not None and b else None  # noqa: E731
        if free and vllm:
            entry["goodput_ttft_over_unbounded"] = ratio(vllm["goodput_ttft_per_s"], free["goodput_ttft_per_s"])
            entry["admitted_over_unbounded_achieved"] = ratio(vllm["achieved_per_s"], free["achieved_per_s"])
        if vllm and flame:
            entry["flame_over_vllm_goodput_ttft"] = ratio(flame["goodput_ttft_per_s"], vllm["goodput_ttft_per_s"])
        out.append(entry)
    return out


def _parsed(raw: bytes):
    """A trial's JSON, read as every manifest is (parity.manifest.strict_loads: no NaN or Infinity, which derive
    would write back out as a record that is not JSON, no key given twice, no nesting too deep to read), and
    UTF-8; ValueError, one line, where it is not."""
    try:
        return strict_loads(raw.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise ValueError(f"not UTF-8 JSON ({type(e).__name__})") from None
    except ValueError as e:  # a JSONDecodeError says where in it, as a reader fixing it needs
        raise ValueError(f"not strict JSON ({e})") from None


def _read_regular(path: Path, follow: bool = True) -> bytes:
    """The bytes of the regular file at `path` (parity.manifest.read_regular: never a FIFO waited on; unless
    `follow`, never through a symbolic link); ValueError, one line, for anything else."""
    try:
        return read_regular(path, follow)
    except (ManifestError, IsADirectoryError):
        raise ValueError("not a regular file (a folder, pipe or device)") from None
    except OSError as e:
        if e.errno == errno.ELOOP and not follow:
            raise ValueError("not a regular file (a symbolic link)") from None
        raise ValueError(f"not readable ({e.strerror})") from None


class Unreadable(ValueError):
    """A manifest among the trials that derive cannot read: which (`tid`) and why."""

    def __init__(self, tid: str, why: str):
        super().__init__(f"{tid}: {why}")
        self.tid, self.why = tid, why


_READ_ERRORS = (KeyError, TypeError, ValueError, AttributeError, ZeroDivisionError)


def _summarized(tid: str, doc: dict, raw: bytes) -> tuple[dict, dict]:
    """A trial's latency summary and its record entry, each derived once (a trial's entry and its pair's share it)."""
    try:
        summary = summarize(doc)
        return summary, trial(doc, raw, summary)
    except _READ_ERRORS as e:
        raise Unreadable(tid, f"not a trial manifest derive can read ({type(e).__name__}: "
                              f"{' '.join(str(e).split())})") from None


def derive(manifests: dict[str, bytes], named: bool = True) -> dict:
    """Trial id -> manifest bytes, to the record's derived part: every trial, every whole pair, every rung. Each trial
    read strictly, and (unless not `named`: a test's ids given on purpose) named for its own trial_id: another trial's
    numbers under its name would pass for its own."""
    docs = {}
    for tid in sorted(manifests):
        try:
            docs[tid] = _parsed(manifests[tid])
        except ValueError as e:
            raise Unreadable(tid, str(e)) from None
    done = {}
    for tid in sorted(docs):
        try:  # a stated rate its records do not give is refused, as the report refuses it (an outside tester's)
            mismatch = timing_mismatch(docs[tid])
        except (KeyError, TypeError, ValueError):
            mismatch = None  # not a trial: _summarized names it
        if mismatch:
            raise Unreadable(tid, f"a trial whose timing is not what its records give ({mismatch})")
        done[tid] = _summarized(tid, docs[tid], manifests[tid])
        if named and done[tid][1]["trial"] != tid:
            raise Unreadable(tid, f"not named for its trial_id {done[tid][1]['trial']!r}")
    summaries = {tid: summary for tid, (summary, _) in done.items()}
    trials = [entry for _, entry in done.values()]
    names = sorted({tid.rsplit("-", 1)[0] for tid in docs if tid.rsplit("-", 1)[-1] in SIDES and not ADMISSION.match(tid)})
    pairs = [pair(n, docs[f"{n}-flame"], docs[f"{n}-vllm"], summaries[f"{n}-flame"], summaries[f"{n}-vllm"])
             for n in names if f"{n}-flame" in docs and f"{n}-vllm" in docs]
    return {"rungs": rungs(pairs), "pairs": pairs, "bounded": bounded(summaries), "trials": trials}


def _experiment(stated, archive: Path, files: dict[str, tuple[bytes, int]], trials: dict[str, bytes]) -> list[str]:
    """Where the record states the experiment manifest its archive holds ({path, sha256}): that file, byte for
    byte, linking exactly the archive's trials by their SHA-256, and admitting none against another objective than
    it states (`parity report` judges goodput by it; parity.experiments.derive checks the same on a results tree)."""
    if not (isinstance(stated, dict) and isinstance(stated.get("path"), str) and isinstance(stated.get("sha256"), str)):
        return ["its experiment is not an object of a path and a sha256"]
    data = files.get(stated["path"].removeprefix("./"), (None,))[0]
    if data is None:
        return [f"its experiment {stated['path']} is not in {archive.name}"]
    if hashlib.sha256(data).hexdigest() != stated["sha256"]:
        return [f"its experiment {stated['path']} has SHA-256 {hashlib.sha256(data).hexdigest()}, the record says "
                f"{stated['sha256']}"]
    try:
        doc = _parsed(data)
        linked = {case["trial_id"]: case["manifest"]["sha256"] for case in doc["cases"]}
        objective = doc["settings"].get("objective")
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        return [f"its experiment {stated['path']} is not an experiment manifest ({type(e).__name__}: {e})"]
    problems = [f"its experiment links trial {tid} {'by another SHA-256' if tid in trials else 'not in the archive'}"
                for tid, sha in sorted(linked.items()) if hashlib.sha256(trials.get(tid, b"")).hexdigest() != sha]
    problems += [f"its experiment does not link archived trial {tid}" for tid in sorted(set(trials) - set(linked))]
    for tid, data in sorted(trials.items()):
        judged = admitted_against(_parsed(data))
        if judged is not None and judged != objective:
            problems.append(f"its experiment states objective {objective!r}, trial {tid} was admitted against "
                            f"{judged!r}")
            break
    return problems


def trial_manifests(files: dict[str, tuple[bytes, int]]) -> dict[str, bytes]:
    """The trial manifests among an archive's files (results/host/<experiment>/trials/<id>.json, no other), by trial
    id; tarball.Unreadable where a trial id is held twice (which of the two is the trial's, the one read last?)."""
    out, where = {}, {}
    for name, (data, _) in sorted(files.items()):
        parts = name.split("/")
        if len(parts) == 5 and parts[:2] == ["results", "host"] and parts[3] == "trials" and parts[4].endswith(".json"):
            tid = parts[4].removesuffix(".json")
            if tid in out:
                raise tarball.Unreadable(f"holds trial {tid} twice ({where[tid]} and {name})")
            out[tid], where[tid] = data, name
    return out


def archived(path: Path) -> dict[str, bytes]:
    """The trial manifests in a session's archive, by trial id (tarball.Unreadable where it cannot be read whole)."""
    return trial_manifests(tarball.read(path))


def _tolerance(key: str) -> float:
    """What a stated number may differ by: its rounding (ms to 0.1, ratios and rates to 1e-4)."""
    return 0.051 if key.endswith("_ms") or key in {"p50", "p90", "p99", "mean"} else 1.01e-4


def _differences(stated, derived, where: str, tol: float = 0.0) -> list[str]:
    if isinstance(stated, dict) and isinstance(derived, dict):
        return [d for k in stated.keys() & derived.keys()
                for d in _differences(stated[k], derived[k], f"{where}.{k}", max(tol, _tolerance(k)))]
    if isinstance(stated, list) and isinstance(derived, list) and len(stated) == len(derived):
        return [d for i, (a, b) in enumerate(zip(stated, derived)) for d in _differences(a, b, f"{where}[{i}]", tol)]
    if isinstance(stated, bool) or isinstance(derived, bool) or not isinstance(stated, (int, float)):
        same = stated == derived and isinstance(stated, bool) == isinstance(derived, bool)  # 1 is not true here
        return [] if same else [f"{where}: the record says {stated!r}, its trials give {derived!r}"]
    if isinstance(derived, (int, float)) and math.isclose(stated, derived, rel_tol=0, abs_tol=tol):
        return []
    return [f"{where}: the record says {stated!r}, its trials give {derived!r}"]


def _entries(record: dict, key: str, ident: str, said) -> list[dict]:
    """The record's `key` section as a list of objects each naming itself by a string `ident` (absent: none); one
    line through `said`, and nothing to compare, where it is anything else."""
    listed = record.get(key, [])
    if isinstance(listed, list) and all(isinstance(e, dict) and isinstance(e.get(ident), str) for e in listed):
        return listed
    said([f"its {key} are not a list of objects that each name their {ident}"])
    return []


def _shape(stated, derived, where: str, extra: bool = True) -> list[str]:
    """Keys a stated object has that its derivation lacks (forged; only where `extra`), and keys it leaves out, at
    every depth."""
    if not (isinstance(stated, dict) and isinstance(derived, dict)):
        return []
    return ([f"{where}.{k}: the record states it, its trials give no such thing"
             for k in sorted(stated.keys() - derived.keys()) if extra]
            + [f"{where}.{k}: its trials give it, the record leaves it out" for k in sorted(derived.keys() - stated.keys())]
            + [d for k in stated.keys() & derived.keys() for d in _shape(stated[k], derived[k], f"{where}.{k}", extra)])


UUID = re.compile(r"GPU-[0-9a-f-]{36}")


def _gpus(record: dict, trials: list[dict]) -> list[str]:
    """The record's `gpus` (a phrase -> "NVIDIA H200, GPU-..., driver ..." object, or a string) names every GPU its
    archive's trials ran on, and no other."""
    stated = set(UUID.findall(json.dumps(record.get("gpus", ""))))
    ran = {uuid for t in trials for uuid in t["gpu"]}
    return ([f"its gpus do not name {uuid}, which its trials ran on" for uuid in sorted(ran - stated)]
            + [f"its gpus name {uuid}, which none of its trials ran on" for uuid in sorted(stated - ran)])


def check(record_path: Path) -> list[str]:
    """Each way `record_path` disagrees with the archive it names (empty: none)."""
    try:
        record = _parsed(_read_regular(record_path))  # read as strictly as its trials
    except ValueError as e:
        return [f"{record_path.name}: not a readable JSON record ({e})"]
    if not isinstance(record, dict):
        return [f"{record_path.name}: not a record (a JSON object)"]
    stated = record.get("archive")
    name = stated.split(":")[0].strip() if isinstance(stated, str) else ""
    if not name:
        return [f"{record_path.name}: names no archive"]
    if "/" in name or "\\" in name or name in {".", ".."}:  # an absolute path, a `..` or a folder: not beside it
        return [f"{record_path.name}: its archive {name} is not a file name beside it"]
    archive = record_path.parent / name
    if not archive.is_file():
        return [f"{record_path.name}: its archive {name} is not beside it"]
    try:
        files = tarball.read(archive)  # read once: its trials, and the experiment manifest it may hold
        trials = trial_manifests(files)
        derived = derive(trials)
    except Unreadable as e:
        return [f"{record_path.name}: its archive {name}'s trial {e.tid} is {e.why}"]
    except tarball.Unreadable as e:  # cut short, corrupt, not an archive: one line, never read in part
        return [f"{record_path.name}: its archive {name} {e}"]
    except (OSError, json.JSONDecodeError, KeyError, TypeError) as e:
        return [f"{record_path.name}: its archive {name} cannot be read as trial manifests ({type(e).__name__}: "
                f"{' '.join(str(e).split())})"]
    problems: list[str] = []
    said = lambda lines: problems.extend(f"{record_path.name}: {line}" for line in lines)  # noqa: E731
    stated_sha = re.findall(r"\bsha256 ([0-9a-f]{64})\b", stated)  # the archive's hash, where the record states it
    if stated_sha:
        actual = hashlib.sha256(_read_regular(archive)).hexdigest()  # a repacked archive (its trials kept, other
        # evidence edited: a GPU's name in gpu.txt) agreed by its trials alone (an outsider's, 2026-12-07)
        if stated_sha[-1] != actual:
            said([f"its archive {name} has sha256 {actual}, not the {stated_sha[-1]} it states"])
    if "experiment" in record:
        said(_experiment(record["experiment"], archive, files, trials))
    sections = {key: _entries(record, key, ident, said) for key, ident in
                (("trials", "trial"), ("pairs", "pair"), ("rungs", "rung"), ("bounded", "rung"))}
    malformed = {key for key in sections if key in record and sections[key] is not record[key]}
    stated_pairs = sections["pairs"] + [v for v in record.values() if isinstance(v, dict) and isinstance(v.get("pair"), str)]
    # The record states exactly what its archive derives: every trial, pair, rung and bounded rung (a section its
    # trials give nothing for may be left out), each once, with every key its derivation has. Trials, pairs and rungs
    # may carry hand-written notes beside those (a trial's `call`, `arm`, `engine_cpus`; a pair's `recorded_in`);
    # the bounded ladder (issue 30) states nothing else.
    for stated_list, key, ident, absent in ((sections["trials"], "trials", "trial", "is not in"),
                                            (stated_pairs, "pairs", "pair", "has no two trials in"),
                                            (sections["rungs"], "rungs", "rung", "has no pair in"),
                                            (sections["bounded"], "bounded", "rung", "has no trial in")):
        label = "bounded" if key == "bounded" else ident
        by_name = {entry[ident]: entry for entry in derived[key]}
        seen: set[str] = set()
        for stated in stated_list:
            where = f"{label} {stated[ident]}"
            if stated[ident] in seen:
                said([f"{where} is stated twice"])
                continue
            seen.add(stated[ident])
            if stated[ident] not in by_name:
                said([f"{where} {absent} {name}"])
                continue
            said(_shape(stated, by_name[stated[ident]], where, extra=key == "bounded")
                 + _differences(stated, by_name[stated[ident]], where))
        if key in malformed:  # (said once, above)
            continue
        of = "its archive" if key == "trials" else "its trials"
        label = "bounded rung" if key == "bounded" else ident
        said(f"{label} {n} of {of} is not stated" for n in by_name if n not in seen)
    said(_gpus(record, derived["trials"]))
    return problems


def _not_a_trial(raw: bytes) -> str | None:
    """Why `raw` is not a trial manifest derive can read (None: it is one)."""
    try:
        doc = _parsed(raw)
    except ValueError as e:
        return str(e)
    if not (isinstance(doc, dict) and isinstance(doc.get("records"), list) and isinstance(doc.get("trial_id"), str)):
        return "not a trial manifest (an object with a trial_id and records)"
    return None  # what derive itself cannot read, it names (Unreadable)


def _emit(text: str) -> int:
    """`text` on stdout, flushed here: a full disk or a closed pipe is one line and exit 1, not a traceback (and
    stdout then points at /dev/null, so Python's own flush at exit finds nothing left to fail on)."""
    try:
        sys.stdout.write(text + "\n")
        sys.stdout.flush()
    except OSError as e:
        print(f"ladder_record.py: cannot write its output ({e.strerror or e})", file=sys.stderr)
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except (OSError, ValueError, io.UnsupportedOperation):
            pass
        return 1
    return 0


def main(argv: list[str]) -> int:
    if "-h" in argv or "--help" in argv:
        return _emit(__doc__.split("\n\n")[1])
    if len(argv) >= 2 and argv[0] == "derive":
        folder = Path(argv[1])
        if not folder.is_dir():
            print(f"ladder_record.py: {argv[1]} is not a folder", file=sys.stderr)
            return 2
        paths = sorted(folder.glob("*.json"))
        if not paths:
            print(f"ladder_record.py: no trial manifests in {argv[1]}", file=sys.stderr)
            return 2
        # Refused, not skipped: derive's folder is a session's extracted trials/, whose derivation becomes the record's
        # trials, pairs and rungs; a file there that is no trial is the wrong folder or a damaged trial, and skipping it
        # would write a record silently short of that trial (which check then refuses against the archive). Only its
        # regular files are read: a link may lead out of it (another folder's trial, twice), a FIFO would never end.
        manifests = {}
        for p in paths:
            try:
                raw = _read_regular(p, follow=False)
            except ValueError as e:
                raw, why = None, str(e)
            else:
                why = _not_a_trial(raw)
            if why:
                print(f"ladder_record.py: {p} is {why}; derive reads a folder of trial manifests only", file=sys.stderr)
                return 2
            manifests[p.stem] = raw
        try:
            derived = derive(manifests)
        except Unreadable as e:
            print(f"ladder_record.py: {folder / e.tid}.json is {e.why}; derive reads a folder of trial manifests only",
                  file=sys.stderr)
            return 2
        except _READ_ERRORS as e:  # (a pair's two trials)
            print(f"ladder_record.py: the trials in {argv[1]} cannot be derived ({type(e).__name__}: "
                  f"{' '.join(str(e).split())})", file=sys.stderr)
            return 2
        try:
            text = json.dumps(derived, indent=1, allow_nan=False)  # whole before a byte is written
        except ValueError as e:
            print(f"ladder_record.py: the trials in {argv[1]} derive a number JSON cannot hold ({e})", file=sys.stderr)
            return 2
        return _emit(text)
    if len(argv) >= 2 and argv[0] == "check":
        problems = [p for path in argv[1:] for p in check(Path(path))]
        failed = _emit("\n".join(problems) if problems else f"{len(argv) - 1} record(s) agree with their archives")
        return 1 if problems or failed else 0
    print(__doc__.split("\n\n")[1], file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
