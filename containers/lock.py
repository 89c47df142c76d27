"""Resolve containers/requirements.in into containers/requirements.lock, every pin with its PyPI hashes.

Why: `pip install --require-hashes` is all-or-nothing, so the image needs every transitive
requirement at one exact version, with the hashes of the files that image can install: CPython 3.12
on manylinux x86_64 with glibc 2.39 (Ubuntu 24.04, the CUDA base image's OS).

How: `uv pip compile` resolves requirements.in together with pyproject.toml's runtime dependencies
and its `gpu`, `workflow` and `mlperf` extras, for that target. Then, for each pin, PyPI's JSON simple API
(PEP 691) lists the release's files; the lock keeps the hashes of the wheels the target can install
(or of the sdist when no such wheel exists), and each must be one uv also reported. An sdist's
note in the lock names its [build-system] requires, read from the sdist itself: `%post` builds it
with --no-build-isolation, so those must be in the lock too (tests/test_container.py checks). `--check`
re-checks a committed lock against PyPI without resolving anything. `--part-cpu OUT --python PY3.12` writes
the lock's CPU part (what `.[workflow,mlperf]` and the build backends %post installs first need, resolved by
that Python's pip against the lock's pins as constraints), for the offline smoke image (`make image
IMAGE_LOCK=OUT`): every pin and hash copied from the lock, none resolved anew.

Run from the repository root with a Python that has `packaging` (the project's .venv has it) and
`uv` on PATH (or `--uv PATH`):  .venv/bin/python containers/lock.py
"""

from __future__ import annotations

import argparse
import json
import shutil
import hashlib
import io
import subprocess
import sys
import tarfile
import tempfile
import tomllib
import urllib.request
from pathlib import Path

from packaging.tags import compatible_tags, cpython_tags
from packaging.utils import canonicalize_name, parse_sdist_filename, parse_wheel_filename
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
from parity.container import (  # noqa: E402
    build_backends, final_stage, lock_part, lock_problems, parse_lock, read_definition)

IN_FILE = ROOT / "containers" / "requirements.in"
LOCK_FILE = ROOT / "containers" / "requirements.lock"
INDEX = "https://pypi.org/simple"
PYTHON = (3, 12)
GLIBC = (2, 39)  # Ubuntu 24.04
UV_PLATFORM = f"x86_64-manylinux_{GLIBC[0]}_{GLIBC[1]}"
EXTRAS = ("gpu", "workflow", "mlperf")  # mlperf: the accuracy jobs (ROUGE, NLTK) run in the image too

# Facts about single pins that the lock should carry next to them, for a reader auditing it.
NOTES = {
    "torch": "PyPI's cp312 manylinux_2_28_x86_64 wheel of torch 2.13.0 is the CUDA 13.0 build: its "
             "torch/version.py says __version__ = '2.13.0+cu130', cuda = '13.0' (read from the wheel on PyPI); "
             "%test checks the +cu130 label in the built image.",
}


def target_tags() -> frozenset[str]:
    """Wheel tags a CPython 3.12 manylinux x86_64 interpreter on glibc 2.39 accepts."""
    platforms = [f"manylinux_2_{minor}_x86_64" for minor in range(GLIBC[1], 4, -1)]
    platforms += ["manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64", "linux_x86_64"]
    tags = list(cpython_tags(PYTHON, platforms=platforms)) + list(compatible_tags(PYTHON, "cp312", platforms))
    return frozenset(str(tag) for tag in tags)


def fetch_files(name: str) -> list[dict]:
    """The project's files on PyPI (PEP 691 JSON): filename, hashes, yanked."""
    request = urllib.request.Request(f"{INDEX}/{canonicalize_name(name)}/",
                                     headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    with urllib.request.urlopen(request, timeout=120) as response:
        return json.load(response)["files"]


def release_hashes(name: str, version: str, tags: frozenset[str]) -> tuple[list[str], str]:
    """(sha256 hashes, "wheel" or "sdist") of the files of name==version the target can install."""
    wheels, sdists = [], []
    for entry in fetch_files(name):
        filename = entry["filename"]
        try:
            if filename.endswith(".whl"):
                _, file_version, _, file_tags = parse_wheel_filename(filename)
                if file_version == Version(version) and {str(t) for t in file_tags} & tags:
                    wheels.append(entry)
            elif filename.endswith((".tar.gz", ".zip")):
                _, file_version = parse_sdist_filename(filename)
                if file_version == Version(version):
                    sdists.append(entry)
        except ValueError:
            continue  # an old upload with a non-standard name; never ours
    chosen, kind = (wheels, "wheel") if wheels else (sdists, "sdist")
    if not chosen:
        raise SystemExit(f"lock: {name}=={version}: PyPI has no file this target can install")
    yanked = [e["filename"] for e in chosen if e.get("yanked")]
    if yanked:
        raise SystemExit(f"lock: {name}=={version}: yanked on PyPI: {', '.join(yanked)}")
    return sorted(e["hashes"]["sha256"] for e in chosen), kind


# PEP 517's default for a source tree without [build-system] (a setup.py-only sdist).
LEGACY_BUILD_REQUIRES = ["setuptools>=40.8.0"]


def sdist_build_requires(name: str, version: str) -> list[str]:
    """The [build-system] requires of name==version's sdist on PyPI, read from the archive (hash-checked)."""
    entry = next(e for e in fetch_files(name) if e["filename"].endswith(".tar.gz")
                 and _version_of(e["filename"]) == Version(version))
    with urllib.request.urlopen(entry["url"], timeout=120) as response:
        data = response.read()
    if hashlib.sha256(data).hexdigest() != entry["hashes"]["sha256"]:
        raise SystemExit(f"lock: {entry['filename']}: sha256 differs from PyPI's")
    with tarfile.open(fileobj=io.BytesIO(data)) as archive:
        member = next((m for m in archive.getmembers() if m.name.count("/") == 1
                       and m.name.endswith("/pyproject.toml")), None)
        if member is None:
            return LEGACY_BUILD_REQUIRES
        pyproject = tomllib.loads(archive.extractfile(member).read().decode("utf-8"))
    return pyproject.get("build-system", {}).get("requires", LEGACY_BUILD_REQUIRES)


def resolve(uv: str) -> str:
    """uv's hashed, platform-specific resolution of requirements.in + pyproject.toml, as text.

    uv prefers the versions already in its output file, so the committed lock is copied there first:
    adding a requirement pins what is new and leaves every other pin as it was.
    """
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "resolved.txt"
        if LOCK_FILE.exists():
            shutil.copyfile(LOCK_FILE, out)
        command = [uv, "pip", "compile", str(IN_FILE), str(ROOT / "pyproject.toml"),
                   *[arg for extra in EXTRAS for arg in ("--extra", extra)],
                   "--generate-hashes", "--no-header", "--no-annotate", "--quiet", "--no-python-downloads",
                   "--python-version", ".".join(map(str, PYTHON)), "--python-platform", UV_PLATFORM,
                   "--index-url", INDEX, "--output-file", str(out)]
        subprocess.run(command, check=True, cwd=ROOT)
        return out.read_text(encoding="utf-8")


def render(entries: list[tuple[str, str, list[str], str, list[str]]]) -> str:
    """The lock's text: a header, then `name==version` with one --hash line per file, sorted by name."""
    lines = [
        "# The image's Python packages, for `pip install --require-hashes --no-deps` (containers/parity.def).",
        "# Generated by containers/lock.py from containers/requirements.in and pyproject.toml (extras: "
        + ", ".join(EXTRAS) + "); do not edit by hand.",
        f"# Target: CPython {PYTHON[0]}.{PYTHON[1]}, manylinux x86_64, glibc {GLIBC[0]}.{GLIBC[1]} (Ubuntu 24.04).",
        "# Hashes: PyPI's published sha256 of each wheel that target can install (the sdist where there is",
        "# no such wheel), each also reported by uv's resolution.",
        "",
    ]
    for name, version, hashes, kind, build_requires in entries:
        if name in NOTES:
            lines.append(f"# {name}: {NOTES[name]}")
        if kind == "sdist":
            lines.append(f"# {name}: sdist only (no cp312 manylinux x86_64 wheel); built with --no-build-isolation; "
                         f"build requires: {', '.join(build_requires)}")
        lines.append(" \\\n".join([f"{name}=={version}"] + [f"    --hash=sha256:{h}" for h in hashes]))
    return "\n".join(lines) + "\n"


def lock(uv: str) -> int:
    resolved = parse_lock(resolve(uv), source="uv output")
    tags = target_tags()
    entries = []
    for name, pin in sorted(resolved.items()):
        hashes, kind = release_hashes(name, pin.version, tags)
        unknown = sorted(set(hashes) - set(pin.hashes))
        if unknown:
            raise SystemExit(f"lock: {name}=={pin.version}: PyPI lists hashes uv did not: {unknown}")
        build_requires = sdist_build_requires(name, pin.version) if kind == "sdist" else []
        entries.append((name, pin.version, hashes, kind, build_requires))
        print(f"{name}=={pin.version}: {len(hashes)} {kind} hash(es)", file=sys.stderr)
    text = render(entries)
    problems = lock_problems(text)
    if problems:
        raise SystemExit("lock: " + "; ".join(problems))
    LOCK_FILE.write_text(text, encoding="utf-8")
    print(f"wrote {LOCK_FILE.relative_to(ROOT)}: {len(entries)} pins", file=sys.stderr)
    return 0


def check() -> int:
    """Every hash in the committed lock is one PyPI publishes for that exact release."""
    pins = parse_lock(LOCK_FILE.read_text(encoding="utf-8"), source=str(LOCK_FILE))
    failures = 0
    for name, pin in sorted(pins.items()):
        published = {e["hashes"]["sha256"] for e in fetch_files(name)
                     if not e.get("yanked") and _version_of(e["filename"]) == Version(pin.version)}
        stray = sorted(set(pin.hashes) - published)
        if stray:
            failures += 1
            print(f"MISMATCH {name}=={pin.version}: not published by PyPI: {stray}", file=sys.stderr)
    print(f"checked {len(pins)} pins against PyPI: {failures} mismatch(es)", file=sys.stderr)
    return 1 if failures else 0


def _version_of(filename: str) -> Version | None:
    try:
        if filename.endswith(".whl"):
            return parse_wheel_filename(filename)[1]
        return parse_sdist_filename(filename)[1]
    except ValueError:
        return None


def part_cpu(python: str, out: Path) -> int:
    """The CPU part of the committed lock, written to `out` (see the module's docstring)."""
    version = subprocess.run([python, "-c", "import sys; print(*sys.version_info[:2])"], capture_output=True,
                             text=True, check=True).stdout.split()
    if tuple(int(v) for v in version) != PYTHON:
        sys.exit(f"lock.py: --python must be CPython {PYTHON[0]}.{PYTHON[1]} (the image's), got {'.'.join(version)}")
    text = LOCK_FILE.read_text(encoding="utf-8")
    backends = build_backends(final_stage(read_definition(ROOT / "containers" / "parity.def")))
    with tempfile.TemporaryDirectory() as tmp:
        constraints, report = Path(tmp, "constraints.txt"), Path(tmp, "report.json")
        constraints.write_text("".join(f"{p.name}=={p.version}\n" for p in parse_lock(text).values()))
        subprocess.run([python, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet", "--report",
                        str(report), "-c", str(constraints), f"{ROOT}[workflow,mlperf]", *backends], check=True)
        names = [item["metadata"]["name"] for item in json.loads(report.read_text())["install"]]
    names = [name for name in names if canonicalize_name(name) != "parity"]  # installed from the source
    out.write_text(lock_part(text, names, backends, "CPU part of containers/requirements.lock: what .[workflow,mlperf] "
                             "and the build backends %post installs first\nneed on CPython 3.12 (containers/lock.py "
                             "--part-cpu), for the offline smoke image."), encoding="utf-8")
    print(f"{out}: {len(parse_lock(out.read_text(encoding='utf-8')))} pins")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--uv", default=shutil.which("uv"), help="the uv executable (default: uv on PATH)")
    parser.add_argument("--check", action="store_true", help="verify the committed lock's hashes against PyPI")
    parser.add_argument("--part-cpu", type=Path, metavar="OUT", help="write the lock's CPU part here (needs --python)")
    parser.add_argument("--python", help="a CPython 3.12 whose pip resolves the CPU part")
    args = parser.parse_args(argv)
    if args.check:
        return check()
    if args.part_cpu:
        if not args.python:
            parser.error("--part-cpu needs --python, a CPython 3.12 (the image's)")
        return part_cpu(args.python, args.part_cpu)
    if not args.uv:
        parser.error("uv not found: pip install uv (a throwaway venv will do) and pass --uv PATH")
    return lock(args.uv)


if __name__ == "__main__":
    sys.exit(main())
