"""The four per-request checks of every trial, and its verdict.

- input: each record's input hash equals the trace's hash for that request (what was submitted is
  what the trace holds, also after compression and decompression), and its prompt_tokens (the prompt's
  length as the engine counted it) the trace's token count for it;
- coverage: every request of the trace appears exactly once (a record, or a refusal of bounded admission),
  at its own position in the burst, and nothing else does;
- output length: every request produced exactly its trial's max_tokens (the study's 16), or exactly
  its own length where the trial drew one per request (parity.lengths);
- placement: each logical shard ran on one GPU, no two on the same one (except in Flame's `global`
  session, whose workers share one queue), the GPUs named in the trial, and, where a pinning is given
  (e.g. from the paired standalone trial), the same GPU UUID per shard.
A trial that fails a check is marked failed with the reasons, and excluded from statistics later; the
checks only ever write the verdict, never a record.

A trial manifest must also say only what its records give: its timing is recomputed from them
(`timing_mismatch`), its records may not contradict one another (`records_contradict`), and a finished
trial's verdict is recomputed too (`unsupported`), so an edited number or a verdict left "passed" over
broken records is caught wherever a trial is read again.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections import Counter
from pathlib import Path

from parity.engine import OUTPUT_TOKENS
from parity.engine.sim import answers_like_the_simulator
from parity.errors import ParityError, first_problem
from parity.manifest import read_manifest, validate_document, write_manifest
from parity.record import config_sha256, timing
from parity.routing import PLACEMENTS
from parity.schedule import PACED, Schedule, offsets_sha256
from parity.trace import Trace, load_trace

CHECKS = ("input", "coverage", "output_length", "placement")


def shard_gpus(records: list[dict]) -> dict[int, set[str]]:
    out: dict[int, set[str]] = {}
    for r in records:
        out.setdefault(r["shard"], set()).add(r["gpu_uuid"])
    return out


def pinning_of(doc: dict) -> dict[int, str]:
    """Shard → GPU UUID as a trial actually ran (only for shards that ran on one GPU)."""
    return {shard: next(iter(gpus)) for shard, gpus in shard_gpus(doc["records"]).items() if len(gpus) == 1}


def _input(doc: dict, trace: Trace) -> list[str]:
    expected = {r.id: r for r in trace.requests}
    records = [r for r in doc["records"] if r["request_id"] in expected]
    bad = [r["request_id"] for r in records if r["input_sha256"] != expected[r["request_id"]].sha256]
    reasons = [f"{len(bad)} request(s) submitted inputs that differ from the trace, e.g. {bad[0]}"] if bad else []
    if miscounted := [r for r in records if r["prompt_tokens"] != expected[r["request_id"]].tokens]:
        first = miscounted[0]
        reasons.append(f"{len(miscounted)} request(s) whose prompt_tokens are not the trace's token count, e.g. "
                       f"{first['request_id']} ({first['prompt_tokens']}, the trace has "
                       f"{expected[first['request_id']].tokens})")
    return reasons


def _coverage(doc: dict, trace: Trace) -> list[str]:
    """Every request of the trace once: ran (a record) or refused by bounded admission (`refused`), not both."""
    seen = Counter(r["request_id"] for r in doc["records"] + doc.get("refused", []))
    wanted = {r.id for r in trace.requests}
    reasons = []
    if missing := sorted(wanted - set(seen)):
        reasons.append(f"{len(missing)} request(s) missing, e.g. {missing[0]}")
    if twice := sorted(rid for rid, n in seen.items() if n > 1):
        reasons.append(f"{len(twice)} request(s) recorded more than once, e.g. {twice[0]}")
    if extra := sorted(set(seen) - wanted):
        reasons.append(f"{len(extra)} record(s) not in the trace, e.g. {extra[0]}")
    position = {r.id: r.position for r in trace.requests}
    if moved := [r["request_id"] for r in doc["records"] + doc.get("refused", [])
                 if r["request_id"] in position and r["position"] != position[r["request_id"]]]:
        reasons.append(f"{len(moved)} request(s) at a position other than the trace's, e.g. {moved[0]}")
    return reasons


def _output_length(doc: dict) -> list[str]:
    """Exactly the trial's max_tokens (the study's 16) when EOS is ignored, as its engine arguments say; with
    lengths per request (parity.lengths), exactly each record's own, and those the ones the trial drew."""
    args = doc["engine"].get("args") or {}
    wanted = args.get("max_tokens", OUTPUT_TOKENS)
    if args.get("ignore_eos", True) is False:
        bad = [r["request_id"] for r in doc["records"] if not 1 <= len(r["output_token_ids"]) <= wanted]
        return [f"{len(bad)} request(s) with no output or more than {wanted} tokens, e.g. {bad[0]}"] if bad else []
    if "output_lengths" in doc:
        return _own_lengths(doc)
    bad = [r["request_id"] for r in doc["records"] if len(r["output_token_ids"]) != wanted]
    return [f"{len(bad)} request(s) without exactly {wanted} output tokens, e.g. {bad[0]}"] if bad else []


def _own_lengths(doc: dict) -> list[str]:
    """Each record's length is the one its trial's recorded settings draw, and its output exactly that long."""
    from parity.lengths import OutputLengths, lengths_sha256

    records, block = doc["records"], doc["output_lengths"]
    if unasked := [r["request_id"] for r in records if "max_tokens" not in r]:
        return [f"{len(unasked)} request(s) without the output length they asked for, e.g. {unasked[0]}"]
    reasons = []
    settings = OutputLengths.from_dict({f.name: block[f.name] for f in dataclasses.fields(OutputLengths)
                                        if f.name in block})  # replay: only where set
    if lengths_sha256([r["max_tokens"] for r in records]) != lengths_sha256(settings.draw(len(records))):
        reasons.append("the records' output lengths are not the ones the trial's output_lengths settings draw")
    bad = [r for r in records if len(r["output_token_ids"]) != r["max_tokens"]]
    if bad:
        reasons.append(f"{len(bad)} request(s) without exactly the output length they asked for, e.g. "
                       f"{bad[0]['request_id']} ({len(bad[0]['output_token_ids'])} tokens, asked {bad[0]['max_tokens']})")
    return reasons


def _placement(doc: dict, pinning: dict[int, str] | None, exclusive: bool) -> list[str]:
    """Exclusive shards (all placements but Flame's `global` session) each ran on one GPU of their own."""
    reasons = []
    named = {g["uuid"] for g in doc["gpus"]}
    by_shard = shard_gpus(doc["records"])
    for shard, gpus in sorted(by_shard.items()):
        if exclusive and len(gpus) != 1:
            reasons.append(f"shard {shard} ran on {len(gpus)} GPUs: {sorted(gpus)}")
        if gpus - named:
            reasons.append(f"shard {shard} ran on GPUs the trial does not name: {sorted(gpus - named)}")
        if pinning is not None and shard in pinning and gpus != {pinning[shard]}:
            reasons.append(f"shard {shard} ran on {sorted(gpus)}, pinned to {pinning[shard]}")
    if exclusive:
        shards_on: dict[str, list[int]] = {}
        for shard, gpus in sorted(by_shard.items()):
            for gpu in gpus:
                shards_on.setdefault(gpu, []).append(shard)
        reasons += [f"shards {', '.join(map(str, shards))} ran on the same GPU {gpu}"
                    for gpu, shards in sorted(shards_on.items()) if len(shards) > 1]
    return reasons


def check_trial(doc: dict, trace: Trace, pinning: dict[int, str] | None = None) -> dict:
    """The verdict of one trial: every check with its outcome, the reasons for any failure, and the
    pinning it was held to (so the verdict can be recomputed from the trial alone)."""
    placement = PLACEMENTS.get(doc.get("config", {}).get("placement"))  # None: a name not ours
    exclusive = placement is None or not placement.shared_session  # a shared session's GPUs take tasks in turn
    found = {"input": _input(doc, trace), "coverage": _coverage(doc, trace),
             "output_length": _output_length(doc), "placement": _placement(doc, pinning, exclusive)}
    if "jit" in doc:  # ours: a trial whose engines watched their kernel compilations (parity.jit)
        found["warm"] = _warm(doc)
    checks = {name: ({"passed": False, "detail": "; ".join(r)} if r else {"passed": True})
              for name, r in found.items()}
    reasons = [f"{name}: {reason}" for name, rs in found.items() for reason in rs]
    verdict = {"status": "failed" if reasons else "passed", "checks": checks, "reasons": reasons}
    if pinning is not None:
        verdict["pinning"] = {str(shard): gpu for shard, gpu in sorted(pinning.items())}
    return verdict


def _warm(doc: dict) -> list[str]:
    """No kernel compiled inside the timed window: one that did cost the rung what warm engines would not."""
    measured = doc["jit"].get("measured") or []
    if not measured:
        return []
    return [f"{len(measured)} kernel compilations inside the timed window ({', '.join(sorted(set(measured)))}): "
            "the warm-ups did not cover what the measured phase ran"]


def timing_mismatch(doc: dict) -> str | None:
    """Why a trial's stated timing is not what its records give (release to last completion), else None."""
    records, stated = doc["records"], doc["timing"]
    if not records:
        return "it holds no records"
    if min(r["submit_s"] for r in records) < stated["release_s"]:
        return "a record was submitted before the burst's release"
    if any(r["complete_s"] < r["submit_s"] for r in records):
        return "a record completed before it was submitted"
    given = timing(records, stated["release_s"])
    wrong = [k for k, v in given.items() if not math.isclose(stated[k], v, rel_tol=1e-9, abs_tol=1e-12)]
    if wrong:
        return (f"it states {stated['requests_per_s']:.6g} requests/s, its {len(records)} records give "
                f"{given['requests_per_s']:.6g} ({', '.join(wrong)} differ)")
    return None


CLOCK_SLACK_S = 1e-6  # a sum of two float seconds is off by far less; no forgery that small moves a millisecond


def _token_times_wrong(record: dict) -> str | None:
    """Why a record's token times cannot be (a first token before its arrival, tokens out of order, a token after
    its completion), else None: every latency the report gives is read from them, and a re-hashed edit of them moved
    a p99 and passed (an outsider's, 2026-12-07)."""
    times = record.get("token_s")
    if not times:
        return None
    if "arrival_s" in record and times[0] < record["arrival_s"] - CLOCK_SLACK_S:
        return f"first token came {record['arrival_s'] - times[0]:.6g} s before its arrival"
    if any(later < earlier - CLOCK_SLACK_S for earlier, later in zip(times, times[1:])):
        return "token times go back in time"
    if times[-1] > record["complete_s"] + CLOCK_SLACK_S:
        return f"last token came {times[-1] - record['complete_s']:.6g} s after its completion"
    if "sent_s" in record and times[0] < record["sent_s"] - CLOCK_SLACK_S:  # a retried request leaves late on purpose:
        # its first token moved before its send moved the TTFT p99 and passed (outside pass K)
        return f"first token came {record['sent_s'] - times[0]:.6g} s before it was sent"
    return None


def _send_times_wrong(record: dict) -> tuple[str, str] | None:
    """(field, why) where a record's send times cannot be (sent before its arrival or after its completion; a
    `due_s`, when a retried or held request's last try was due, not after its arrival and by its send), else None:
    the report's send lag is read from them, and re-hashed edits of them passed `validate` (outside pass K)."""
    sent, arrival, due = record.get("sent_s"), record.get("arrival_s"), record.get("due_s")
    if sent is None:
        return None if due is None else ("due_s", "states when it was due to leave, but not when it left (sent_s)")
    if arrival is not None and sent < arrival - CLOCK_SLACK_S:
        return "sent_s", f"was sent {arrival - sent:.6g} s before its arrival"
    if sent > record["complete_s"] + CLOCK_SLACK_S:
        return "sent_s", f"was sent {sent - record['complete_s']:.6g} s after its completion"
    if due is not None and (arrival is not None and due < arrival + CLOCK_SLACK_S or due > sent + CLOCK_SLACK_S):
        return "due_s", (f"was due to leave at {due!r}: a retry's or a hold's last try is due after its arrival "
                         f"({arrival!r}) and by its send ({sent!r})")
    return None


def records_contradict(doc: dict) -> tuple[str, str] | None:
    """(pointer, why) where a trial's records contradict one another, else None: a record that found more of its
    prompt cached than the prompt holds, or two requests (ran or refused) at one position of the burst. The schema
    cannot say either (one value against another, or across items); a forgery made them pass `check`, `validate`
    and `seal` (an outside tester's 2026 pass)."""
    for index, record in enumerate(doc["records"]):
        if record["cached_tokens"] > record["prompt_tokens"]:
            return (f"/records/{index}/cached_tokens", f"{record['cached_tokens']} cached tokens of a "
                                                       f"{record['prompt_tokens']}-token prompt ({record['request_id']})")
        if found := _send_times_wrong(record):
            return f"/records/{index}/{found[0]}", f"{record['request_id']} {found[1]}"
        if why := _token_times_wrong(record):
            return f"/records/{index}/token_s", f"{record['request_id']}'s {why}"
    if found := _sends_missing(doc):
        return found
    at: dict[int, str] = {}
    for field in ("records", "refused"):
        for index, record in enumerate(doc.get(field, [])):
            if record["position"] in at:
                return (f"/{field}/{index}/position", f"{record['request_id']} is at position {record['position']}, "
                                                      f"as {at[record['position']]} is: one request per position")
            at[record["position"]] = record["request_id"]
    return None


def _sends_missing(doc: dict) -> tuple[str, str] | None:
    """(pointer, why) where some records state when they were sent and others not, or none do on a schedule: both paths
    record every request's send on a paced or replayed schedule and none in a burst, and the report's send lag is read
    from them, so the most lagged sends deleted (or all) passed `validate` and moved the lag (outside passes M, N)."""
    records = doc["records"]
    missing = [index for index, record in enumerate(records) if "sent_s" not in record]
    if not missing or not records:
        return None
    if len(missing) < len(records):
        return (f"/records/{missing[0]}/sent_s", f"absent on {len(missing)} record(s) where the other "
                                                 f"{len(records) - len(missing)} state theirs: a path records every "
                                                 "request's send or none")
    if (doc.get("schedule") or {}).get("kind") not in (None, "burst"):  # paced or replayed: arrivals, and sends
        return "/records/0/sent_s", "absent on every record of a trial on a schedule, which records each request's send"
    return None


def arrivals_mismatch(doc: dict) -> tuple[str, str] | None:
    """(pointer, why) where a paced trial's arrivals are not its schedule's, else None: every request's latency and
    its place in the steady-state window are measured from its `arrival_s`, which is the release plus its offset, and
    the offsets are the recorded schedule's own (their SHA-256 recorded). A refusal without one, or one moved, left
    the window's goodput and `validate` (an outsider's, 2026-12-07)."""
    recorded = doc.get("schedule") or {}
    ran = ((doc.get("ran_with") or {}).get("load") or {}).get("schedule")  # what the run asked for
    if ran is not None:  # the trial's schedule is the one it ran with: a paced trial relabelled a replay, or its
        # offsets' hash deleted, skipped this check, and arrivals moved with it passed (outside pass K)
        if recorded.get("kind") != ran.get("kind"):
            return "/schedule/kind", (f"states {recorded.get('kind')!r}, the trial ran with a {ran.get('kind')!r} "
                                      "schedule (ran_with.load.schedule)")
        if ran.get("kind") in PACED:
            if wrong := [key for key, value in ran.items() if recorded.get(key) != value]:
                return f"/schedule/{wrong[0]}", (f"states {recorded.get(wrong[0])!r}, the trial ran with "
                                                 f"{ran[wrong[0]]!r} (ran_with.load.schedule)")
            if "offsets_sha256" not in recorded:
                return "/schedule/offsets_sha256", "absent, yet the trial ran on a paced schedule: its arrivals are checked by it"
    if recorded.get("kind") not in PACED or "offsets_sha256" not in recorded:
        return None  # a burst has no arrivals; a replay's are its file's (linked by hash, read where it is used)
    try:
        schedule = Schedule.from_dict({f.name: recorded[f.name] for f in dataclasses.fields(Schedule)
                                       if f.name in recorded})  # as `_own_lengths` reads its settings
        count = recorded["requests"]
        offsets = schedule.offsets(count)
    except (ParityError, KeyError, TypeError, ValueError) as exc:
        return "/schedule", f"its offsets cannot be made again: {exc}"
    if offsets_sha256(offsets) != recorded["offsets_sha256"]:
        return "/schedule/offsets_sha256", "is not the SHA-256 of the offsets its schedule's settings give"
    release = doc["timing"]["release_s"]
    for field in ("records", "refused"):
        for index, record in enumerate(doc.get(field, [])):
            position = record["position"]
            if "arrival_s" not in record:
                return (f"/{field}/{index}", f"{record['request_id']} has no arrival_s, yet the trial ran on a "
                                             f"{recorded['kind']} schedule")
            if position >= count or abs(record["arrival_s"] - (release + offsets[position])) > 1e-6:
                due = "past the schedule's requests" if position >= count else f"{release + offsets[position]!r}"
                return (f"/{field}/{index}/arrival_s", f"{record['arrival_s']!r} is not the schedule's arrival for "
                                                       f"position {position} (the release plus its offset: {due})")
    # each of the schedule's requests once, a completion or a refusal: one deleted (its count lowered to match) moved
    # every rate and goodput of the window it was in, and passed (an outsider's, 2026-12-07)
    seen = {record["position"] for field in ("records", "refused") for record in doc.get(field, [])}  # each once:
    if missing := count - len(seen):  # `records_contradict`
        first = next(p for p in range(count) if p not in seen)
        return "/records", (f"{missing} of the schedule's {count} requests are neither a record nor a refusal "
                            f"(position {first} the first)")
    return None


def admission_mismatch(doc: dict) -> tuple[str, str] | None:
    """(pointer, why) where what a trial states of its admission is not what it ran or recorded, else None: its
    admitted and refused counts against its records and refusals, a retry count under settings that allow none, and
    its settings against those it ran with (`ran_with.load.admission`). Each passed `validate` edited (an outsider's,
    2026-12-07)."""
    stats, refused = doc.get("admission"), doc.get("refused") or []
    recorded = doc.get("ran_with")  # what a run asked for (an experiment's case, a run command's options)
    ran = ((recorded or {}).get("load") or {}).get("admission")
    late = [index for index, record in enumerate(doc["records"]) if "due_s" in record]  # a retry's or a hold's
    if stats is None:
        if refused:
            return "/admission", f"absent, yet {len(refused)} request(s) were refused: only bounded admission refuses"
        if late:
            return (f"/records/{late[0]}/due_s", "states when a retry or a hold let it leave, yet the trial ran without "
                                                 "bounded admission, which alone retries or holds")
        if ran is not None:
            return "/admission", "absent, yet the trial ran with bounded admission (ran_with.load.admission)"
        return None
    if recorded is not None and ran is None:
        return "/ran_with/load/admission", "absent, yet the trial states its admission"
    if ran is not None and ran != stats["settings"] | {"objective": stats["objective"]}:
        return "/admission/settings", "are not the settings and objective the trial ran with (ran_with.load.admission)"
    if stats["admitted"] != len(doc["records"]):
        return "/admission/admitted", f"states {stats['admitted']}, the trial has {len(doc['records'])} records"
    retries = stats["settings"].get("retries", 0)
    if stats["refused"] != len(refused) if not retries else stats["refused"] < len(refused):
        return "/admission/refused", (f"states {stats['refused']}, its refusals number {len(refused)}"
                                      + (" (with retries, each refused try counts: at least that)" if retries else ""))
    if stats.get("retried", 0) and not retries or stats.get("retried", 0) > stats["admitted"]:
        return "/admission/retried", (f"states {stats['retried']}, under settings that allow {retries} retries and "
                                      f"{stats['admitted']} admitted")
    for index, refusal in enumerate(refused):  # its tries as retry.Attempts.final words them: none said without
        # retries, all retries + 1 of them, or 1 to retries when a retry would have come past its budget ("refused on
        # all 9 tries" under 2 retries passed: outside pass M; a count under 0 retries: pass N)
        said = _TRIES.search(refusal.get("reason", ""))
        if said and (not retries or (int(said.group(2)) != retries + 1 if said.group(1)
                                     else not 1 <= int(said.group(2)) <= retries)):
            return f"/refused/{index}/reason", (f"says {said.group(0)[2:]!r}, under settings that allow {retries} "
                                                f"retries ({retries + 1} tries)")
    if retries and (tries := _final_tries(refused)) is not None:  # each refused try counted once: a refusal's own
        # (its reason says how many it had), and an admitted retry's, one to `retries` each; a completed request moved
        # into the refusals, the counts edited to match, passed (outside pass K)
        low, high = tries + stats.get("retried", 0), tries + stats.get("retried", 0) * retries
        if not low <= stats["refused"] <= high:
            return "/admission/refused", (f"states {stats['refused']} refused tries, yet its refusals had {tries} and "
                                          f"its {stats.get('retried', 0)} admitted retries between "
                                          f"{stats.get('retried', 0)} and {stats.get('retried', 0) * retries}")
    if len(late) != stats.get("retried", 0) + stats.get("held_admitted", 0):  # each of those left late, and says when
        return "/admission/retried", (f"states {stats.get('retried', 0)} admitted on a retry and "
                                      f"{stats.get('held_admitted', 0)} after a hold, yet {len(late)} record(s) say "
                                      "when a retry or a hold let them leave (due_s)")
    return None


_TRIES = re.compile(r"; refused on (all )?(\d+) tr(?:y|ies)")  # parity.admission.retry.Attempts.final's words


def _final_tries(refused: list[dict]) -> int | None:
    """The tries a trial's requests refused for good had, summed from their reasons (None where one does not say)."""
    total = 0
    for refusal in refused:
        said = _TRIES.search(refusal.get("reason", ""))
        if said is None:
            return None
        total += int(said.group(2))
    return total


def read_trial(path: Path) -> dict:
    """A trial manifest: of kind trial, schema-valid, its records consistent, its timing what they give; else
    one-line ParityError."""
    doc = read_manifest(path)
    if doc.get("kind") != "trial":
        raise ParityError(f"{path} is not a trial manifest (kind {doc.get('kind')!r})")
    problems = validate_document(doc, path=path)
    if problems:
        raise ParityError(first_problem(problems))
    if found := records_contradict(doc):
        raise ParityError(f"{path}: {found[0]}: its records contradict one another: {found[1]}")
    if why := timing_mismatch(doc):
        raise ParityError(f"{path}: its timing is not what its records give: {why}")
    return doc


def trace_of(path: Path, doc: dict) -> Trace:
    """The trace a trial links, as long as it is still the file the trial ran (same SHA-256)."""
    trace = load_trace(path.parent / doc["trace"]["path"])
    if trace.manifest_sha256 != doc["trace"]["sha256"]:
        raise ParityError(f"{path} names trace {doc['trace']['path']} with SHA-256 {doc['trace']['sha256']}, "
                          f"but that file now has {trace.manifest_sha256}")
    return trace


def unsupported(doc: dict, trace: Trace) -> str | None:
    """Why a checked trial's verdict is not the one its records give now (held to its recorded pinning), else None."""
    stated = doc["verdict"]
    pinning = {int(k): v for k, v in stated["pinning"].items()} if "pinning" in stated else None
    fresh = check_trial(doc, trace, pinning)
    if fresh == stated:
        return None
    if fresh["status"] != stated["status"]:
        return (f"its verdict says {stated['status']}, its records say {fresh['status']}"
                + (f" ({fresh['reasons'][0]})" if fresh["reasons"] else ""))
    return "its verdict's checks or reasons differ from what its records give"


def check_file(path: Path, pinning: dict[int, str] | None = None) -> dict:
    """Check a trial manifest against the trace it links, and write its verdict (only the verdict)."""
    doc = read_trial(path)
    doc["verdict"] = check_trial(doc, trace_of(path, doc), pinning)
    write_manifest(path, doc)
    return doc["verdict"]


def gpus_unnamed(doc: dict) -> str | None:
    """Why a trial's records ran on GPUs its `ran_with` does not name (a trial re-labelled for another machine),
    else None: a moved ladder keeps a trial by the GPUs `ran_with` names."""
    named = set((doc.get("ran_with") or {}).get("gpus") or [])
    used = {r.get("gpu_uuid") for r in doc.get("records", []) if isinstance(r, dict) and r.get("gpu_uuid")}
    if named and used - named:
        return f"its records ran on {', '.join(sorted(used - named))}, which its ran_with gpus do not name"
    return None


def derived_problems(path: Path, doc: dict) -> list[tuple[str, str]]:
    """(pointer, why) for each thing a trial states that its records and its trace do not give: its timing,
    and its verdict held to its recorded pinning (`parity.rederive`: what a re-hash cannot forge)."""
    found = []
    if contradiction := records_contradict(doc):
        found.append((contradiction[0], f"its records contradict one another: {contradiction[1]}"))
    if why := timing_mismatch(doc):
        found.append(("/timing", f"its timing is not what its records give: {why}"))
    for mismatch in (arrivals_mismatch(doc), admission_mismatch(doc)):
        if mismatch:
            found.append(mismatch)
    if why := gpus_unnamed(doc):
        found.append(("/ran_with/gpus", why))
    if "config" in doc and doc.get("config_sha256") != config_sha256(doc["config"]):
        found.append(("/config_sha256", "is not the SHA-256 of its config: the config was edited after the run"))
    if doc.get("placement_verified", True) is not True:  # the Flame path writes a trial only once it verified it
        found.append(("/placement_verified", f"states {doc['placement_verified']!r}: the Flame path writes a trial "
                                             "only once every batch's placement is verified (its placement check "
                                             "says how)"))
    router = doc.get("router") or {}
    if router.get("realized_cached_tokens") is not None:  # the engines' own counts, which the records hold
        held = sum(r["cached_tokens"] for r in doc["records"])
        if router["realized_cached_tokens"] != held:
            found.append(("/router/realized_cached_tokens", f"states {router['realized_cached_tokens']}, its records' "
                                                            f"cached tokens sum to {held}"))
    try:
        trace = trace_of(path, doc)
    except ParityError as exc:
        return found + [("/trace", f"its verdict cannot be re-derived: {exc}")]
    if why := unsupported(doc, trace):
        found.append(("/verdict", why))
    if doc["simulated"] is False and _simulators_answers(doc, trace):
        found.append(("/simulated", "states False, yet every output is the one the simulator gives its prompt (a "
                                    "function of the prompt alone, parity.engine.sim): a simulated trial relabelled"))
    return found


def _simulators_answers(doc: dict, trace: Trace) -> bool:
    """Whether a trial's outputs are the simulator's, from its records and trace alone (no label is trusted)."""
    prompts = {r.id: p for r, p in zip(trace.requests, trace.prompts)}
    records = [r for r in doc["records"] if r["request_id"] in prompts and r.get("output_token_ids")]
    return answers_like_the_simulator([prompts[r["request_id"]] for r in records],
                                      [r["output_token_ids"] for r in records])
