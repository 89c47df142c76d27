"""The run's evidence bundle: its results and workflow in a BagIt bag, a Workflow Run RO-Crate inside.

`make` copies a sealed results tree (`parity.seal`: every kept file linked from its run manifest), the
inputs its manifests link from outside it (a corpus, a tokenizer, fetch receipts; never weights, which
no manifest links as a file) and the workflow that made them (Snakefile, rules, config, profiles,
schemas) into a staging folder whose `data/` mirrors the work folder, so every relative link still
resolves. It describes them in an RO-Crate written with `rocrate` (the Workflow Run Crate profile: the
Snakefile the main entity, as a ComputationalWorkflow; one CreateAction for the run and one per
Snakemake job, read from Snakemake's own job records in `.snakemake/metadata`: rule, inputs, outputs,
command, start, end, status; the software and GPUs the trial manifests name), then makes the folder a
BagIt bag (`bagit`: SHA-256 and SHA-512 of every file). `check` validates a bag: every changed,
missing or added file is one problem naming it; then the crate's MUSTs; then the sealed trees inside
are re-certified as `parity validate` would. Nothing here decides whether a result is good.
"""

from __future__ import annotations

import base64
import datetime
import json
import logging
import mimetypes
import os
import shutil
from pathlib import Path

from parity import __version__, signature
from parity.errors import ParityError
from parity.manifest import (RUN_MANIFEST, is_manifest_file, linked_files, manifests_in, printable,
                             read_manifest, sha256_file)
from parity.seal import kept, sealed_trees, superseded
from parity.signature import SIGNATURE

CRATE = "ro-crate-metadata.json"
RO_CRATE = "1.1"  # Workflow Run Crate 0.5 builds on RO-Crate 1.1 and Workflow RO-Crate 1.0 (roc-validator checks so)
PROFILES = {  # what the crate conforms to, as the Workflow Run Crate profile asks the root to say
    "https://w3id.org/ro/wfrun/process/0.5": "Process Run Crate",
    "https://w3id.org/ro/wfrun/workflow/0.5": "Workflow Run Crate",
    "https://w3id.org/workflowhub/workflow-ro-crate/1.0": "Workflow RO-Crate",
}
WORKFLOW_FILES = ("Snakefile", "workflow", "config", "profiles", "schemas")  # the workflow that made the results
URLS = {"python": "https://www.python.org/", "flame": "https://github.com/xflops/flame",  # where a reviewer gets each
        **{name: f"https://pypi.org/project/{name}/" for name in ("flamepy", "mlperf_loadgen", "numpy", "torch", "vllm")}}
COMPLETED, FAILED = "http://schema.org/CompletedActionStatus", "http://schema.org/FailedActionStatus"
CHECKSUMS = ("sha256", "sha512")
LICENSE = "https://spdx.org/licenses/Apache-2.0"
FORMATS = {".jsonl": "application/jsonl", ".log": "text/plain", ".smk": "text/x-python", ".yaml": "application/yaml",
           ".tokens": "application/octet-stream", ".conf": "text/plain"}  # suffixes `mimetypes` does not know


class BundleError(ParityError):
    """A bundle that cannot be made, or one that fails validation."""


def jobs(workdir: Path, results: Path) -> list[dict]:
    """Snakemake's records of the jobs that wrote into `results` (one per job, its outputs gathered), oldest
    first: what each CreateAction of the crate says."""
    folder = workdir / ".snakemake" / "metadata"
    by_job: dict = {}
    for record_file in sorted(folder.glob("*")) if folder.is_dir() else []:
        try:
            output = base64.urlsafe_b64decode(record_file.name + "=" * (-len(record_file.name) % 4)).decode()
            record = json.loads(record_file.read_text(encoding="utf-8"))
        except (ValueError, UnicodeDecodeError, OSError):
            continue  # not a job record (Snakemake keeps other files there too)
        if not isinstance(record, dict) or not (workdir / output).resolve().is_relative_to(results.resolve()):
            continue
        job = by_job.setdefault(record.get("job_hash"), {"rule": record.get("rule"), "outputs": [],
                                                          "inputs": record.get("input") or [],
                                                          "logs": record.get("log") or [],
                                                          "command": record.get("shellcmd"),
                                                          "start": record.get("starttime"), "end": record.get("endtime"),
                                                          "incomplete": bool(record.get("incomplete"))})
        job["outputs"].append(output)
    return sorted(by_job.values(), key=lambda j: (j["start"] or 0, j["rule"] or ""))


def _entity(crate, entity_id: str, kind: str, **properties):
    """A contextual entity of the crate (a profile, a piece of software, a GPU, a rule)."""
    from rocrate.model.contextentity import ContextEntity

    return crate.add(ContextEntity(crate, entity_id, properties={"@type": kind, **properties}))


def _iso(seconds: float | None) -> str | None:
    if seconds is None:
        return None
    return datetime.datetime.fromtimestamp(seconds, datetime.timezone.utc).isoformat(timespec="seconds")


def _provenance(results: Path, files: list[Path]) -> tuple[dict, list[dict]]:
    """Software versions and GPUs as the run's trial manifests record them (not an earlier run's its seal calls
    superseded: `parity.seal.superseded`)."""
    versions: dict[str, set] = {}
    gpus: dict[str, dict] = {}
    earlier = superseded(results)
    for rel in files:
        if rel.suffix != ".json" or "trials" not in rel.parts or rel in earlier:
            continue
        try:
            doc = json.loads((results / rel).read_text(encoding="utf-8"))
        except (ValueError, OSError):
            continue
        if doc.get("kind") != "trial":
            continue
        for name, version in (doc.get("versions") or {}).items():
            if version:
                versions.setdefault(name, set()).add(str(version))
        engine = doc.get("engine") or {}  # the version the engine reports (a Flame worker's own vLLM)
        if engine.get("version") and not engine.get("simulated"):
            name = "vllm" if str(engine.get("name", "")).startswith("vllm") else engine.get("name", "engine")
            versions.setdefault(name, set()).add(str(engine["version"]))
        binaries = doc.get("flame_binaries")
        for binary in binaries.values() if isinstance(binaries, dict) else []:
            if isinstance(binary, dict) and binary.get("version"):
                versions.setdefault("flame", set()).add(binary["version"])
        for gpu in doc.get("gpus") or []:
            if gpu.get("uuid"):
                gpus.setdefault(gpu["uuid"], {k: v for k, v in gpu.items() if isinstance(v, (str, int))})
    return {name: sorted(v) for name, v in sorted(versions.items())}, [gpus[u] for u in sorted(gpus)]


def _format(path: Path) -> dict:
    """The file's media type where one is known (RO-Crate recommends `encodingFormat`)."""
    kind = mimetypes.guess_type(path.name)[0] or FORMATS.get(path.suffix)
    return {"encodingFormat": kind} if kind else {}


def _base(results: Path, workdir: Path) -> Path:
    """The folder the bundle's `data/` mirrors: the work folder, or the results' parent if they lie elsewhere."""
    results = results.resolve()
    return workdir.resolve() if results.is_relative_to(workdir.resolve()) else results.parent


def _place(path: Path, base: Path) -> str:
    """Where a file lies in the bundle's `data/`: where it lies under `base`, so relative links still resolve."""
    return path.resolve().relative_to(base).as_posix()


def _reached(manifests: list[tuple[Path, dict]]) -> dict[Path, Path]:
    """Every file `manifests` link, and onward what each linked manifest links in turn (a fetch receipt's
    `derived_from`: a bundle without its parquet failed its own check, outside pass R), by absolute path, each with
    the manifest that links it."""
    found: dict[Path, Path] = {}
    seen = {Path(os.path.abspath(path)) for path, _ in manifests}
    queue = list(manifests)
    while queue:
        manifest, doc = queue.pop()
        for target in linked_files(doc, manifest):
            if target in found:
                continue
            found[target] = manifest
            if target not in seen and target.suffix == ".json" and is_manifest_file(target):
                seen.add(target)
                queue.append((target, read_manifest(target)))
    return found


def _inputs(results: Path, base: Path) -> list[Path]:
    """The files the tree's manifests link from outside it (a corpus, a tokenizer, a fetch receipt and what it links),
    which the bundle holds too; one outside `base` cannot be placed, so the bundle is refused, naming it."""
    here, found = results.resolve(), set()
    for target, manifest in _reached(manifests_in(results)).items():
        target = target.resolve()
        if target.is_relative_to(here) or target in found or not target.is_file():
            continue
        if not target.is_relative_to(base):
            raise BundleError(f"{manifest} links {target}, outside {base}: bundle from a work folder that holds it")
        found.add(target)
    return sorted(found)


def make(results: Path, bundle: Path, *, workdir: Path = Path("."), image: Path | None = None, log=print) -> dict:
    """Write the bag BUNDLE (which must not exist yet, or be an earlier bundle) around RESULTS and the workflow;
    returns a summary (files, bytes, jobs)."""
    import bagit
    from rocrate.rocrate import ROCrate

    results, bundle, workdir = Path(results), Path(bundle), Path(workdir)
    if not results.is_dir():
        raise BundleError(f"no results folder at {results}")
    if not (workdir / "Snakefile").is_file():  # the crate's main entity: found missing only after the work, it was
        raise BundleError(f"--workdir {workdir}: no Snakefile (give the workflow's folder)")  # a traceback
    if bundle.resolve().is_relative_to(results.resolve()):
        raise BundleError(f"the bundle {bundle} must lie outside the results it holds ({results})")
    if not (results / RUN_MANIFEST).is_file():
        raise BundleError(f"{results} is not sealed (no {RUN_MANIFEST}): run `parity seal {results}` first")
    if image is not None and not Path(image).is_file():
        raise BundleError(f"no Apptainer image at {image}: name the .sif the run used, or leave --image out")
    if stale := _evidence_problems(results):  # bag only what `validate` vouches for now
        raise BundleError(f"{results} no longer validates ({len(stale)} problem(s), first: {stale[0]}): "
                          f"run `parity seal {results}` again, or find what changed")
    if bundle.exists():
        if not (bundle / "bagit.txt").is_file():
            raise BundleError(f"{bundle} exists and is not a bundle: not replacing it")
        shutil.rmtree(bundle)
    staging = bundle.with_name(bundle.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    base = _base(results, workdir)
    files, records = kept(results), jobs(workdir, results)
    outside = _inputs(results, base)
    log(f"bundle: {len(files)} result files of {results}, {len(outside)} input(s) they link from outside it, "
        f"the workflow, and {len(records)} job records")
    crate = ROCrate(version=RO_CRATE)
    # RO-Crate 1.1's context has no `sha256` term (1.2's maps it to schema.org's): declared beside it, as RO-Crate
    # allows, or a JSON-LD reader drops every file's checksum (roc-validator's REQUIRED check ro-crate-1.1_3.1)
    crate.metadata.extra_terms["sha256"] = "http://schema.org/sha256"
    root = crate.root_dataset
    root["name"] = f"parity evidence: {results.name}"
    root["description"] = ("Reproduction of 'Bringing Flame Serving Close to Standalone vLLM': every kept result of one "
                           "run, the workflow that made it, and what ran (simulated results say so in their manifests).")
    root["datePublished"] = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    root["license"] = _entity(crate, LICENSE, "CreativeWork", name="Apache License 2.0", identifier="Apache-2.0")
    workflow = crate.add_workflow(workdir / "Snakefile", "Snakefile", main=True, lang="snakemake")
    workflow["version"] = __version__  # the parity release whose workflow this is
    workflow["encodingFormat"] = FORMATS[".smk"]  # a Snakefile is what its rule files are (roc-validator's 27.1)
    root["conformsTo"] = [_entity(crate, uri, "CreativeWork", name=name, version=uri.rsplit("/", 1)[1])
                          for uri, name in PROFILES.items()]  # after add_workflow, which names one of them itself
    entities = {(workdir / "Snakefile").resolve(): workflow}  # by resolved path: what the job records name
    if (workdir / "README.md").is_file():  # Workflow RO-Crate 1.0 recommends a README.md about the crate
        entities[(workdir / "README.md").resolve()] = crate.add_file(
            workdir / "README.md", "README.md", properties={"encodingFormat": "text/markdown", "about": root})
    for name in WORKFLOW_FILES[1:]:
        for path in sorted((workdir / name).rglob("*")) if (workdir / name).is_dir() else []:
            if path.is_file() and "__pycache__" not in path.parts:
                entities[path.resolve()] = crate.add_file(path, _place(path, workdir.resolve()), properties=_format(path))
    signed = [results / SIGNATURE] if (results / SIGNATURE).is_file() else []  # not kept (nothing links it), but held
    for path in [results / rel for rel in files] + signed + outside:
        if path.resolve() not in entities:  # an input may be a workflow file (a committed model config)
            entities[path.resolve()] = crate.add_file(path, _place(path, base), properties=_format(path))
    for path, entity in entities.items():  # what the crate says of each file, which `check` holds to the bag
        entity["contentSize"], entity["sha256"] = path.stat().st_size, sha256_file(path)
    versions, gpus = _provenance(results, files)
    said = _stated(versions, gpus)
    software = [_entity(crate, f"#software-{name}", "SoftwareApplication", name=name,
                        softwareVersion=said[f"#software-{name}"], **({"url": URLS[name]} if name in URLS else {}))
                for name in versions]
    if image is not None:
        software.append(_entity(crate, "#image", "SoftwareApplication", name=f"Apptainer image {Path(image).name}",
                                identifier=f"sha256:{sha256_file(Path(image))}"))
    hardware = [_entity(crate, f"#gpu-{g['uuid']}", "Thing", name=said[f"#gpu-{g['uuid']}"], identifier=g["uuid"])
                for g in gpus]
    workflow["softwareRequirements"] = software

    def linked(paths: list[str]):
        """The crate's entities of `paths`: one alone, not a singleton list (RO-Crate 1.1 recommends single values
        in compacted JSON-LD; roc-validator's ro-crate-1.1_24.1)."""
        found = [entities[p] for p in ((workdir / x).resolve() for x in paths) if p in entities]
        return found[0] if len(found) == 1 else found

    rules: dict = {}
    actions: list = []
    for index, job in enumerate(records):
        rule = job["rule"] or "unknown"
        if rule not in rules:
            rules[rule] = _entity(crate, f"#rule-{rule}", "SoftwareApplication", name=f"rule {rule}",
                                  description=f"the Snakemake rule {rule} of the Snakefile", softwareVersion=__version__)
        actions.append(crate.add_action(rules[rule], identifier=f"#job-{index}-{rule}", object=linked(job["inputs"]),
                         result=linked(job["outputs"] + job["logs"]),
                         properties={"name": f"{rule} job {index}", "description": job["command"] or "",
                                     "startTime": _iso(job["start"]), "endTime": _iso(job["end"]),
                                     "actionStatus": FAILED if job["incomplete"] else COMPLETED}))
    # the run's span from Snakemake's job records; without them (a folder bundled by hand), from its files' times
    times = [t for j in records for t in (j["start"], j["end"]) if t] or [(results / rel).stat().st_mtime for rel in files]
    actions.append(crate.add_action(workflow, identifier="#run", object=[e for e in crate.get_entities() if e.id.startswith("config/")]
                     + [entities[p.resolve()] for p in outside if not entities[p.resolve()].id.startswith("config/")],
                     result=[entities[(results / rel).resolve()] for rel in files],
                     properties={"name": f"run of the Snakefile into {results}",
                                 "description": f"the Snakemake run that wrote {results.name}: its config in, its kept files out",
                                 "startTime": _iso(min(times, default=None)), "endTime": _iso(max(times, default=None)),
                                 "actionStatus": FAILED if any(j["incomplete"] for j in records) else COMPLETED}))
    root["mentions"] = software + hardware + actions  # Process Run Crate: the actions, from the root
    logging.getLogger("bagit").setLevel(logging.CRITICAL)  # a full disk is said once, by the caller, not logged too
    try:
        crate.write(staging)
        bagit.make_bag(str(staging), {"Source-Organization": "parity", "External-Description": root["description"]},
                       checksums=list(CHECKSUMS))
        staging.rename(bundle)
    except BaseException as exc:  # a full disk, a kill: no half-made bag is left to fill the disk or be taken for one
        shutil.rmtree(staging, ignore_errors=True)
        if isinstance(exc, OSError) and exc.errno is not None and exc.filename is None:  # bagit's names no file
            raise OSError(exc.errno, exc.strerror, str(bundle)) from None
        raise
    size = sum(p.stat().st_size for p in (bundle / "data").rglob("*") if p.is_file())
    return {"bundle": str(bundle), "files": len(files), "inputs": len(outside), "bytes": size, "jobs": len(records)}


def check(bundle: Path, key=None) -> list[str]:
    """Every problem of the bag BUNDLE, one line each naming the file: changed, missing, or not in its manifest;
    with a `key` (`parity.signature.public_key`), each sealed tree's run.json must be signed by it. A control
    character (a newline in a file's name) is written as its escape: no name poses as another line (outside
    pass P: a file named with a line break printed a false "valid" line)."""
    return [printable(problem) for problem in _problems(Path(bundle), key)]


def _problems(bundle: Path, key) -> list[str]:
    import bagit

    if not (bundle / "bagit.txt").is_file():
        return [f"{bundle}: not a bundle (no bagit.txt)"]
    if not (bundle / "bag-info.txt").is_file():  # parity writes one; a bag re-made without it is not parity's
        return [f"{bundle}: not a parity bundle (no bag-info.txt)"]
    if unreadable := _unreadable_tags(bundle):
        return unreadable
    if (bundle / "fetch.txt").exists():  # parity's bags hold every file; a fetch list points past the checked payload
        return [f"{bundle / 'fetch.txt'}: a fetch list (files to download from elsewhere): a parity bundle holds "
                "every file it lists, so none is fetched"]
    if special := _not_plain(bundle):
        return special
    logging.getLogger("bagit").setLevel(logging.CRITICAL)  # each problem is said once, below, not also logged
    try:
        bag = bagit.Bag(str(bundle))
    except bagit.BagError as exc:
        return [f"{bundle}: {exc}"]
    details, problems = [], []

    def run(step) -> None:
        try:
            step()
        except bagit.BagValidationError as exc:
            details.extend(exc.details or [])
            if not exc.details:
                problems.append(f"{bundle}: {exc.message}")
        except (bagit.BagError, OSError) as exc:
            problems.append(f"{bundle}: {exc}")

    # file by file first: bagit's own validate stops at the payload's total (Payload-Oxum), naming no file
    run(bag._validate_completeness)
    run(lambda: bag._validate_entries(1))
    if not details and not problems:  # then the rest (bagit.txt, the totals, the tag manifests' own lines)
        run(lambda: bag.validate(processes=1))
    missing = {d.path for d in details if isinstance(d, bagit.FileMissing)}
    seen, named = set(), set()
    for detail in details:
        if isinstance(detail, bagit.ChecksumMismatch):
            if detail.path in missing or detail.path in named:
                continue  # one line per file: its absence, or its first digest that differs
            named.add(detail.path)
            line = f"{detail.path}: changed ({detail.algorithm} is {detail.found}, the bag says {detail.expected})"
        elif isinstance(detail, bagit.FileMissing):
            line = f"{detail.path}: missing (the bag lists it)"
        elif isinstance(detail, bagit.UnexpectedFile):
            line = f"{detail.path}: added (not in the bag's manifest)"
        else:
            line = str(detail)
        if line not in seen:
            seen.add(line)
            problems.append(line)
    if problems:
        return problems
    crate = bundle / "data" / CRATE
    try:
        doc = json.loads(crate.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        return [f"{crate}: not a readable RO-Crate ({exc})"]
    if not _shaped(doc):
        return [f"{crate}: {problem}" for problem in crate_problems(doc)]
    try:
        problems = [f"{crate}: {problem}" for problem in crate_problems(doc) + _crate_against_bag(doc, bag)
                    + _crate_against_evidence(doc, bundle / "data")]
        problems += _unaccounted(doc, bag)
    except (AttributeError, TypeError, KeyError) as exc:  # an entity, reference or list of another JSON type
        return [f"{crate}: an entity or reference of the wrong JSON type ({exc}): the crate's entities are objects "
                "and its references objects with an @id"]
    return problems + _evidence_problems(bundle / "data", key)


def _not_plain(bundle: Path) -> list[str]:
    """What in the bag is neither a plain file nor a folder (a named pipe, a socket, a device), named before bagit
    reads it: hashing a named pipe waited for a writer for ever (outside pass P); and, at its top, anything but the
    tag files parity writes and `data/` (a results folder beside `data/` passed for part of the bundle)."""
    problems = []
    for path in sorted(bundle.rglob("*")):
        if not (path.is_symlink() or path.is_file() or path.is_dir()):
            problems.append(f"{path}: not a plain file (a named pipe, socket or device): a bundle holds files")
    for path in sorted(bundle.iterdir()):
        if path.name != "data" and not (path.suffix == ".txt" and path.is_file()):
            problems.append(f"{path}: added (beside data/: a parity bundle holds only its tag files there)")
    return problems


def _unreadable_tags(bundle: Path) -> list[str]:
    """The bag's tag files (its top-level *.txt: bagit.txt, bag-info.txt, the manifests) that are not UTF-8 text,
    as parity writes them and bagit.txt declares, each named: bagit reads them as text, and one that was not
    raised a UnicodeDecodeError traceback naming no file (an outside tester's pass)."""
    problems = []
    for tag in sorted(bundle.glob("*.txt")):
        if not tag.is_file():  # (reading a named pipe would wait for a writer forever)
            problems.append(f"{tag}: not a plain file: a bag's tag files are text")
            continue
        try:
            tag.read_bytes().decode("utf-8-sig")  # bagit allows a byte order mark
        except UnicodeDecodeError as exc:
            problems.append(f"{tag}: not UTF-8 text (byte {exc.start}): a bag's tag files are UTF-8, as its "
                            "bagit.txt declares")
        except OSError as exc:
            problems.append(f"{tag}: cannot be read ({exc.strerror or exc})")
    return problems


def _crate_against_bag(doc: dict, bag) -> list[str]:
    """Each file the crate describes has the size and SHA-256 the bag holds it with (the bag checked the file)."""
    problems = []
    for entity in _graph(doc):
        if "File" not in _list(entity.get("@type")):
            continue
        entry = bag.entries.get(f"data/{entity.get('@id')}")
        if entry is None:
            problems.append(f"the crate describes {entity.get('@id')}, which the bag does not hold")
            continue
        size = (Path(bag.path) / "data" / entity["@id"]).stat().st_size
        if entity.get("contentSize") != size or entity.get("sha256") != entry.get("sha256"):
            problems.append(f"the crate says {entity['@id']} has {entity.get('contentSize')} bytes and SHA-256 "
                            f"{entity.get('sha256')}, the bag holds {size} bytes with {entry.get('sha256')}")
    return problems


def _stated(versions: dict, gpus: list[dict]) -> dict[str, str]:
    """What the crate states of the run's software and GPUs, by entity id: each program's versions (`#software-NAME`:
    its softwareVersion) and each GPU's name (`#gpu-UUID`), as `make` writes them and `check` derives them again."""
    return ({f"#software-{name}": ", ".join(found) for name, found in versions.items()}
            | {f"#gpu-{g['uuid']}": g.get("name") or g["uuid"] for g in gpus})


def _crate_against_evidence(doc: dict, data: Path) -> list[str]:
    """The software and GPUs the crate names, derived again from the trial manifests of the sealed trees it holds
    (`_provenance`, as `make` derived them): a crate re-hashed into its bag after its numpy version was edited
    passed (an outsider's, 2026-12-07)."""
    versions: dict[str, set] = {}
    gpus: dict[str, dict] = {}
    for tree in sealed_trees(data):
        found, seen = _provenance(tree, kept(tree))
        for name, values in found.items():
            versions.setdefault(name, set()).update(values)
        gpus.update({gpu["uuid"]: gpu for gpu in seen})
    derived = _stated({name: sorted(values) for name, values in versions.items()}, list(gpus.values()))
    said = {e.get("@id"): e.get("softwareVersion" if str(e.get("@id")).startswith("#software-") else "name")
            for e in _graph(doc) if str(e.get("@id", "")).startswith(("#software-", "#gpu-"))}
    problems = []
    for ident in sorted(set(derived) | set(said), key=lambda i: (not i.startswith("#software-"), i)):  # software first
        if ident not in said:
            problems.append(f"{ident}: the trials record it, the crate does not name it")
        elif ident not in derived:
            problems.append(f"{ident}: the crate names it, no trial records it")
        elif said[ident] != derived[ident]:
            problems.append(f"{ident}: the crate says version {said[ident]!r}, its trials record {derived[ident]!r}"
                            if ident.startswith("#software-") else
                            f"{ident}: the crate names it as {said[ident]!r}, its trials as {derived[ident]!r}")
    return problems


def _unaccounted(doc: dict, bag) -> list[str]:
    """Each payload file the bundle would not hold, named, one line each: `make` describes every file it places
    in `data/` in the crate (the crate itself aside), and in a sealed tree places only what the tree keeps
    (`seal.kept`) and its signature. The bag's own manifests vouch for nothing here (anyone can recompute them
    around an added file), and a sealed tree's checks see only its kept files: a file added beside the tree, or
    one `kept` passes over (a lock file), was carried silently (an outside evaluator's pass)."""
    data = Path(bag.path) / "data"
    described = {CRATE} | {entity.get("@id") for entity in _graph(doc) if "File" in _list(entity.get("@type"))}
    sealed = sealed_trees(data)
    trees = sorted((tree.relative_to(data) for tree in sealed), key=lambda t: -len(t.parts))
    linked = _reached([item for tree in sealed for item in manifests_in(tree)])  # run.json's inputs among them
    keeps: dict[Path, set] = {}
    problems = []
    for name in sorted(Path(p).relative_to("data").as_posix() for p in bag.payload_files()):
        if name not in described:
            problems.append(f"data/{name}: added (in the bag's payload, but the crate does not describe it)")
            continue
        tree = next((t for t in trees if Path(name).is_relative_to(t)), None)  # the deepest that holds it
        if tree is None:  # outside every sealed tree only the crate, the workflow's files and what the sealed trees
            # link (their inputs, onward): a tree whose run.json was removed, beside a sealed decoy, was held to
            # nothing but hashes a forger recomputes (outside passes P and R)
            if name != CRATE and Path(name).parts[0] not in WORKFLOW_FILES + ("README.md",) \
                    and Path(os.path.abspath(data / name)) not in linked:
                problems.append(f"data/{name}: outside every sealed tree, neither the workflow's nor linked by a "
                                "sealed tree: nothing re-certifies it (its tree's run.json removed?)")
            continue
        if tree not in keeps:
            keeps[tree] = set(kept(data / tree)) | {Path(SIGNATURE)}
        if Path(name).relative_to(tree) not in keeps[tree]:
            problems.append(f"data/{name}: added (in the sealed tree {tree.as_posix()}, which keeps no such file)")
    return problems


def _shaped(doc) -> bool:
    """A JSON object whose @graph is a list: what the crate's checks read (a list or null was a traceback: pass P)."""
    return isinstance(doc, dict) and isinstance(doc.get("@graph"), list)


def _graph(doc) -> list[dict]:
    """The crate's entities (the objects of its @graph; a crate of another shape has none: `crate_problems` says)."""
    return [e for e in doc["@graph"] if isinstance(e, dict)] if _shaped(doc) else []


def _evidence_problems(data: Path, key=None) -> list[str]:
    """The sealed results trees under `data` (a bag's, or one results tree), re-certified: their manifests
    valid, every link's hash right and inside the tree, what they state derived again, every kept file
    linked (`parity validate` on each); one line per problem."""
    from parity.seal import certify

    trees = sealed_trees(data)
    if not trees:
        return [f"{data}: holds no sealed results tree (no run manifest; `parity seal` the results before bundling)"]
    _checked, problems = certify(trees)
    signed = [] if key is None else [line for tree in trees for line in signature.problems(tree, key)]
    return [str(problem) for problem in problems] + signed


def crate_problems(doc) -> list[str]:
    """The Workflow Run Crate MUSTs this crate breaks (RO-Crate 1.1, Workflow RO-Crate, Workflow Run Crate); one
    that is not a JSON object with a @graph list is one line (a list or null was a traceback: outside pass P)."""
    if not _shaped(doc):
        return ["not an RO-Crate: a JSON object whose @graph is a list of entities"]
    graph = {e.get("@id"): e for e in _graph(doc)}
    problems = []
    descriptor = graph.get(CRATE)
    if not descriptor or f"https://w3id.org/ro/crate/{RO_CRATE}" not in {c.get("@id") for c in _list(descriptor.get("conformsTo"))}:
        return [f"the metadata descriptor does not conform to RO-Crate {RO_CRATE}"]
    root = graph.get((descriptor.get("about") or {}).get("@id"))
    if not root or root.get("@type") != "Dataset":
        return ["the descriptor is not about a Dataset"]
    for key in ("name", "description", "datePublished", "license"):
        if not root.get(key):
            problems.append(f"the root dataset has no {key}")
    conforms = {c.get("@id") for c in _list(root.get("conformsTo"))}
    problems += [f"the root does not conform to {uri}" for uri in PROFILES if uri not in conforms]
    main = graph.get((root.get("mainEntity") or {}).get("@id"))
    if not main or "ComputationalWorkflow" not in _list(main.get("@type")):
        problems.append("the main entity is not a ComputationalWorkflow")
    elif not graph.get((main.get("programmingLanguage") or {}).get("@id")):
        problems.append("the workflow names no programmingLanguage entity")
    declared = {k for c in _list(doc.get("@context")) if isinstance(c, dict) for k in c}
    if any("sha256" in e for e in graph.values()) and "sha256" not in declared:  # RO-Crate 1.1's context lacks it
        problems.append("the crate's files carry sha256, a term its RO-Crate 1.1 context does not define and its "
                        "own context does not declare")
    actions = [e for e in graph.values() if "CreateAction" in _list(e.get("@type"))]
    if not any((a.get("instrument") or {}).get("@id") == (main or {}).get("@id") for a in actions):
        problems.append("no CreateAction has the workflow as its instrument")
    for action in actions:
        for key in ("instrument", "startTime", "endTime", "actionStatus"):
            if not action.get(key):
                problems.append(f"CreateAction {action.get('@id')} has no {key}")
        for ref in _list(action.get("object")) + _list(action.get("result")):
            if ref.get("@id") not in graph:
                problems.append(f"CreateAction {action.get('@id')} names {ref.get('@id')}, which the crate does not describe")
    return problems


def _list(value) -> list:
    return value if isinstance(value, list) else [] if value is None else [value]
